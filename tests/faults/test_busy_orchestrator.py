"""One request must not stall the service.

The attack: one caller sends the heaviest request the limits allow (a 4 MiB body of
~120,000 tiny messages used to hold an orchestrator's event loop for 75-84 s; the limits
now refuse that one, so this is 2048 messages of fresh text sharing the 4 MiB). Meanwhile another caller's small requests must keep being
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

from hookbus.bus.limits import RequestLimits
from tests.faults.helpers import finalize_log
from tests.integration.processes import free_port

pytestmark = pytest.mark.slow

BIG, SMALL = "sk-big-caller-0123456789", "sk-small-caller-0123456789"
CLAIM_IDLE = 3.0
"""Seconds without a heartbeat after which a peer claims: short, so a starved heartbeat
would show, yet above the scheduling gaps of a 2-core machine under a shared test run."""
LATENCY_BOUND = 10.0
"""Seconds a small request may take while the big one runs (generous: 2 shared cores)."""


def largest_legal_body() -> bytes:
    """The most work a body within the request limits (bus/limits.py) can ask for: the
    most messages allowed, sharing the whole byte budget as text no token cache has seen
    (about a million tokens, far over the model's window, so it is compacted too)."""
    limits = RequestLimits()
    head, tail = '{"model":"offline","messages":[', "]}"
    per_message = (limits.max_request_bytes - len(head) - len(tail)) // limits.max_messages
    text_chars = per_message - len('{"role":"user","content":""},') - 8
    messages = []
    for n in range(limits.max_messages):
        words = " ".join(f"w{n}x{k}" for k in range(text_chars // 9))
        messages.append(json.dumps({"role": "user", "content": words[:text_chars]}, separators=(",", ":")))
    body = (head + ",".join(messages) + tail).encode()
    assert len(body) <= limits.max_request_bytes
    return body


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
        procs.orchestrator("tests.faults.fault_skills:agent", instance=name, claim_idle=CLAIM_IDLE)
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

        began = time.monotonic()
        big = asyncio.create_task(big_request())
        latencies: list[float] = []
        health: list[int] = []
        while not big.done():
            latencies.append(await small_request(http))
            health.append((await http.get("/healthz")).status_code)
            await asyncio.sleep(0.05)  # the pace of the small requests sent while the big one runs
        response = await big
        took = time.monotonic() - began

    assert response.status_code == 200, response.text[:500]
    completion = response.json()
    assert completion["choices"][0]["message"]["content"].startswith("Offline model reply to:")
    assert len(latencies) >= 3, "the big request ended before it could disturb anything"
    print(
        f"\nbody {len(body)} bytes, {body.count(b'role')} messages, {took:.1f}s; small requests during it: "
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
