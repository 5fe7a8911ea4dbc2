"""A client that disconnects mid-stream cancels its request; finalize_connection runs once.

The gateway's half: on disconnect it writes `{prefix}cancel:{completion_id}` (value: the
reason) and publishes the completion id on `{prefix}cancel`. The orchestrator's half:
it watches for that signal and cancels the agent task, so finalize runs with a 499.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest

from tests.gateway.conftest import bearer
from tests.waiting import wait_for

SLOW = "[[words:2000]] [[delay:5]]"  # about 10 s of streaming: far longer than the test waits


async def stream_a_little_then_hang_up(gateway, session_id: str, chunks: int = 5) -> str:
    """Start a slow stream, read a few chunks, close the connection; returns the completion id."""
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        request = {"model": "offline", "stream": True, "messages": [{"role": "user", "content": SLOW}]}
        async with http.stream(
            "POST", "/v1/chat/completions", json=request,
            headers={**bearer(), "X-Session-Id": session_id},
        ) as response:
            assert response.status_code == 200
            completion_id = response.headers["x-hookbus-completion-id"]
            seen = 0
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    assert json.loads(line.removeprefix("data: "))["id"] == completion_id
                    seen += 1
                    if seen >= chunks:
                        break
    return completion_id  # leaving both blocks closed the connection mid-stream


async def test_a_disconnect_mid_stream_writes_the_cancel_marker(gateway, stack):
    client = stack[0]
    completion_id = await stream_a_little_then_hang_up(gateway, f"disc-{uuid.uuid4().hex[:8]}")
    key = client.keys.cancel(completion_id)
    assert key == f"{client.keys.prefix}cancel:{completion_id}"
    assert await wait_for(lambda: client.redis.get(key), timeout=10) == b"client_disconnected"
    assert 0 < await client.redis.ttl(key) <= 3600


async def test_a_disconnect_mid_stream_cancels_the_request_and_finalize_runs_once(gateway, stack, sessions):
    """Needs the orchestrator to honour the cancel signal (see services/gateway/cancel.py)."""
    client = stack[0]
    session_id = f"disc-{uuid.uuid4().hex[:8]}"
    completion_id = await stream_a_little_then_hang_up(gateway, session_id)
    assert await wait_for(lambda: client.redis.exists(client.keys.cancel(completion_id)), timeout=3)

    async def finalized():
        return (await sessions.load("alice", session_id)).get("finalized")

    # Finalize must run promptly (the model alone would stream for ~10 s more) and with a 499.
    assert await wait_for(finalized, timeout=5) == 1, "finalize_connection did not run after the disconnect"
    data = await sessions.load("alice", session_id)
    assert data["error"] == 499
    await asyncio.sleep(1.0)  # a "nothing more happens" check: no second finalize within a second
    assert (await sessions.load("alice", session_id))["finalized"] == 1, "finalize_connection ran more than once"


async def test_a_client_that_gives_up_on_a_non_streamed_request_cancels_it(gateway, stack):
    client = stack[0]
    pattern = client.keys.cancel("*")
    before = set(await client.redis.keys(pattern))
    request = {"model": "offline", "messages": [{"role": "user", "content": "[[delay:3000]] slow answer"}]}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=0.5) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post("/v1/chat/completions", json=request, headers=bearer())

    async def new_markers():
        return set(await client.redis.keys(pattern)) - before

    (key,) = await wait_for(new_markers, timeout=3)
    assert await client.redis.get(key) == b"client_disconnected"
