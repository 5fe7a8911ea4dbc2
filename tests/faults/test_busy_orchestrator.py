"""One request must not stall the service.

The attack: one caller sends the largest request the gateway accepts, made of as many
tiny messages as fit (a 4 MiB body of ~120,000 messages used to hold an orchestrator's
event loop for 75-84 s). Meanwhile another caller's small requests must keep being
answered promptly, `/healthz` must stay 200, and with two orchestrators the peer must
not take the busy one for dead (no false 503 `orchestrator_lost`).

Everything runs in processes of its own (the offline model too), so the test process
only measures.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import httpx
import pytest

from hookbus.services.gateway.app import MAX_BODY_BYTES
from tests.faults.helpers import finalize_log
from tests.integration.processes import free_port

pytestmark = pytest.mark.slow

BIG, SMALL = "sk-big-caller", "sk-small-caller"
LATENCY_BOUND = 10.0
"""Seconds a small request may take while the big one runs (generous: 2 shared cores)."""


ENVELOPE_ROOM = 16 * 1024
"""What the request envelope adds to the messages (ids, auth, times), under the same limit."""


def largest_legal_body() -> bytes:
    """As many one-character messages as fit in the gateway's body limit (and, once in
    a request envelope, in the client's)."""
    message = '{"role":"user","content":"a"}'
    head, tail = '{"model":"offline","messages":[', "]}"
    count = (MAX_BODY_BYTES - len(head) - len(tail) - ENVELOPE_ROOM) // (len(message) + 1)
    return (head + ",".join([message] * count) + tail).encode()


async def small_request(http: httpx.AsyncClient) -> float:
    began = time.monotonic()
    response = await http.post(
        "/v1/chat/completions",
        headers={"Authorization": f"Bearer {SMALL}"},
        json={"model": "offline", "messages": [{"role": "user", "content": "[[echo]] ping"}]},
    )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "ping"
    return time.monotonic() - began


async def test_a_maximal_request_leaves_other_callers_health_and_the_lease_alone(procs, redis, prefix, tmp_path):
    model_port, gateway_port = free_port(), free_port()
    model = procs.offline_model(port=model_port)
    procs.env["OPENAI_BASE_URL"] = f"http://127.0.0.1:{model_port}/v1"
    api_keys = tmp_path / "keys.json"
    api_keys.write_text(json.dumps({BIG: {"peer_user_id": "big"}, SMALL: {"peer_user_id": "small"}}))
    owners = [
        procs.orchestrator("tests.faults.fault_skills:agent", instance=name, claim_idle=1)
        for name in ("orch-a", "orch-b")
    ]
    gateway = procs.gateway(port=gateway_port, api_keys=api_keys)
    await procs.wait_http(model, f"http://127.0.0.1:{model_port}/v1/models")
    await procs.wait_ready(*owners)
    base = f"http://127.0.0.1:{gateway_port}"
    await procs.wait_http(gateway, f"{base}/healthz")

    body = largest_legal_body()
    async with httpx.AsyncClient(base_url=base, timeout=120) as http:
        baseline = [await small_request(http) for _ in range(5)]

        async def big_request() -> httpx.Response:
            return await http.post(
                "/v1/chat/completions", content=body,
                headers={"Authorization": f"Bearer {BIG}", "Content-Type": "application/json"},
            )

        big = asyncio.create_task(big_request())
        latencies: list[float] = []
        health: list[int] = []
        while not big.done():
            latencies.append(await small_request(http))
            health.append((await http.get("/healthz")).status_code)
            await asyncio.sleep(0.05)
        response = await big

    assert response.status_code == 200, response.text[:500]
    completion = response.json()
    assert completion["choices"][0]["message"]["content"].startswith("Offline model reply to:")
    assert len(latencies) >= 5, "the big request ended before it could disturb anything"
    print(
        f"\nbody {len(body)} bytes, {body.count(b'role')} messages; small requests during it: "
        f"{len(latencies)}, p50 {statistics.median(latencies):.3f}s, max {max(latencies):.3f}s; "
        f"baseline p50 {statistics.median(baseline):.3f}s"
    )
    assert max(latencies) < LATENCY_BOUND
    assert set(health) == {200}
    # the busy owner kept its request: finalized once, by its owner, no recovery
    log = await finalize_log(redis, prefix, completion["id"])
    assert [entry["recovery"] for entry in log] == [False]
    assert log[0]["error"] is None
    assert "request_claimed" not in "".join(p.log_tail(10_000) for p in owners)
