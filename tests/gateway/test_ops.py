"""Operating a gateway: /metrics after traffic, /healthz, API key loading, `serve` and SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import sys
import uuid

import httpx
import pytest

from hookbus.services.gateway.auth import API_KEYS_ENV, load_api_keys
from tests.gateway.conftest import BROKE_KEY, bearer
from tests.gateway.server import running_gateway
from tests.integration.processes import free_port
from tests.waiting import wait_for

CHAT = "/v1/chat/completions"


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text, matching all the given labels."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_metrics_after_traffic(gateway):
    async with httpx.AsyncClient(base_url=gateway.url, headers=bearer(), timeout=30) as http:
        streamed = await http.post(
            CHAT, json={"model": "offline", "stream": True, "messages": [{"role": "user", "content": "[[words:5]]"}]}
        )
        assert streamed.status_code == 200
        tool = await http.post(
            CHAT, json={"model": "offline", "messages": [{"role": "user", "content": '[[tool:remember {"note": "m"}]]'}]}
        )
        assert tool.status_code == 200
        paid = await http.post(
            CHAT, json={"model": "offline", "messages": [{"role": "user", "content": "hi"}]}, headers=bearer(BROKE_KEY)
        )
        assert paid.status_code == 402
        assert (await http.post(CHAT, json={}, headers=bearer())).status_code == 400

        async def scrape_when_bus_metrics_arrived():
            text = (await http.get("/metrics")).text
            ready = (
                sample(text, "hookbus_hops_total", group="tools", lifecycle="tool", outcome="ok")
                and sample(text, "hookbus_stage_duration_seconds_count", lifecycle="on_connection", group="billing")
                and sample(text, "hookbus_agent_requests_total", outcome="failed")
                # the ended requests' pins leave the serving counts at the next publication
                and sample(text, "hookbus_worker_version_serving_requests", group="tools") == 0
            )
            return text if ready else None

        text = await wait_for(scrape_when_bus_metrics_arrived, timeout=30)
    assert text, "bus metrics never showed up"
    response = await httpx.AsyncClient(base_url=gateway.url).get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")

    # the gateway's own traffic
    path = "/v1/chat/completions"
    assert sample(text, "hookbus_gateway_requests_total", path=path, status="200", method="POST") >= 2
    assert sample(text, "hookbus_gateway_requests_total", path=path, status="402") >= 1
    assert sample(text, "hookbus_gateway_requests_total", path=path, status="400") >= 1
    assert sample(text, "hookbus_gateway_errors_total", status="402", code="payment_required") >= 1
    assert sample(text, "hookbus_gateway_request_duration_seconds_count", path=path) >= 4
    assert sample(text, "hookbus_gateway_time_to_first_chunk_seconds_count") >= 1
    assert sample(text, "hookbus_gateway_in_flight_requests") == 0
    # latency per lifecycle and per hook group, hops, whole requests (from the events stream)
    assert sample(text, "hookbus_stage_duration_seconds_bucket", lifecycle="finalize_connection", group="billing", le="+Inf") >= 1
    assert sample(text, "hookbus_hop_duration_seconds_count", group="billing", lifecycle="on_connection") >= 1
    assert sample(text, "hookbus_hops_total", group="billing", lifecycle="on_connection", outcome="aborted") >= 1
    assert sample(text, "hookbus_agent_request_duration_seconds_count", outcome="ok") >= 1
    # queue state, read on scrape
    assert sample(text, "hookbus_queue_lag", stream="requests", group="orchestrators") is not None
    assert sample(text, "hookbus_queue_pending", stream="requests", group="orchestrators") is not None
    assert sample(text, "hookbus_queue_lag", stream="hooks:billing", group="billing") == 0
    assert sample(text, "hookbus_queue_lag", stream="hooks:tools", group="tools") == 0
    assert sample(text, "hookbus_worker_replicas", group="tools") == 1
    # per version: the replicas, the requests pinned and not ended, the hops answered
    [version] = {line.split('version="')[1].split('"')[0] for line in text.splitlines() if line.startswith('hookbus_worker_version_replicas{group="tools"')}
    assert sample(text, "hookbus_worker_version_replicas", group="tools", version=version) == 1
    assert sample(text, "hookbus_worker_version_serving_requests", group="tools", version=version) == 0
    assert sample(text, "hookbus_worker_version_hops_total", group="tools", version=version, outcome="ok") >= 1
    assert sample(text, "hookbus_orchestrators") == 1
    assert sample(text, "hookbus_gateway_redis_up") == 1


async def test_queue_lag_counts_requests_no_orchestrator_took(redis_url, prefix):
    """With no orchestrator consuming, queued requests are lag on `requests`."""
    from hookbus.bus.client import HookbusClient
    from hookbus.bus.connection.retrying import ensure_group

    async with HookbusClient(redis_url, prefix=prefix) as client:
        await ensure_group(client.redis, client.keys.requests, "orchestrators")
        for n in range(3):
            await client.submit(f"queued {n}")
        async with running_gateway(redis_url, prefix) as gw, httpx.AsyncClient(base_url=gw.url) as http:
            text = (await http.get("/metrics")).text
    assert sample(text, "hookbus_queue_lag", stream="requests", group="orchestrators") == 3
    assert sample(text, "hookbus_orchestrators") == 0


async def test_healthz_is_200_with_a_live_orchestrator(gateway):
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        response = await http.get("/healthz", headers=bearer())
        anonymous = await http.get("/healthz")
    assert response.status_code == 200
    health = response.json()
    assert health["status"] == "ok" and health["redis"] == "ok"
    assert health["orchestrators"] == ["orch-0"]
    assert health["worker_groups"] == {"billing": 1, "tools": 1}
    assert anonymous.status_code == 200 and anonymous.json() == {"status": "ok"}  # no instance names


async def test_healthz_is_503_without_an_orchestrator(redis_url, prefix):
    async with running_gateway(redis_url, prefix) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        response = await http.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable", "redis": "ok", "orchestrators": [], "worker_groups": {}}


async def test_healthz_is_503_with_a_stale_orchestrator_heartbeat(redis_url, prefix):
    from redis.asyncio import Redis

    async with Redis.from_url(redis_url) as redis:
        await redis.zadd(f"{prefix}orchestrators", {"orch-old": 1_000_000.0})
        async with running_gateway(redis_url, prefix) as gw, httpx.AsyncClient(base_url=gw.url) as http:
            stale = await http.get("/healthz")
            await redis.zadd(f"{prefix}orchestrators", {"orch-new": __import__("time").time()})
            fresh = await http.get("/healthz")
    assert stale.status_code == 503 and stale.json()["orchestrators"] == []
    assert fresh.status_code == 200 and fresh.json()["orchestrators"] == ["orch-new"]


async def test_healthz_is_503_when_redis_is_unreachable(prefix):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"redis://127.0.0.1:{s.getsockname()[1]}"  # nothing listens once closed
    async with running_gateway(dead, prefix) as gw, httpx.AsyncClient(base_url=gw.url, timeout=10) as http:
        response = await http.get("/healthz")
        metrics = await http.get("/metrics")
    assert response.status_code == 503
    assert response.json()["redis"].startswith("unreachable")
    assert sample(metrics.text, "hookbus_gateway_redis_up") == 0


def test_api_keys_load_from_a_file_or_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(API_KEYS_ENV, raising=False)
    assert load_api_keys(None) is None
    path = tmp_path / "keys.json"
    one, two = f"sk-{uuid.uuid4().hex}", f"sk-{uuid.uuid4().hex}"
    path.write_text(json.dumps({one: {"peer_user_id": "alice", "scopes": ["paid"]}, two: {"peer_user_id": "bob"}}))
    keys = load_api_keys(str(path))
    assert keys[one].peer_user_id == "alice" and keys[one].scopes == ["paid"]
    assert keys[two].peer_user_id == "bob" and keys[two].scopes == []
    env_key = f"sk-{uuid.uuid4().hex}"
    monkeypatch.setenv(API_KEYS_ENV, json.dumps({env_key: {"peer_user_id": "env"}}))
    assert load_api_keys(None)[env_key].peer_user_id == "env"
    assert load_api_keys(str(path)).keys() == {one, two}  # the file wins
    for bad in ("[]", "{}", '{"sk": {"scopes": "paid"}}', "not json", '{"": {}}', json.dumps({one: {}})):
        path.write_text(bad)
        with pytest.raises(ValueError, match="keys.json"):
            load_api_keys(str(path))


async def test_serve_warns_when_auth_is_off_and_stops_gracefully_on_sigterm(redis_url, prefix, tmp_path):
    port = free_port()
    code = (
        "import sys; from hookbus.services.gateway import serve; "
        f"serve('127.0.0.1', {port}, sys.argv[1] or None, {redis_url!r}, {prefix!r})"
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop(API_KEYS_ENV, None)

    async def run(keys_file: str) -> tuple[int, str, httpx.Response]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, keys_file, cwd=os.getcwd(), env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:

                async def answered() -> httpx.Response | None:
                    try:
                        return await http.get("/v1/models")
                    except httpx.TransportError:
                        return None

                response = await wait_for(answered, timeout=30)  # a cold start on a busy machine
                assert response is not None, "the gateway never answered"
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(15):
                output, _ = await proc.communicate()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        return proc.returncode, output.decode(), response

    returncode, output, response = await run("")
    assert returncode == 0, output
    assert response.status_code == 200  # no key needed: auth is off
    assert "AUTH IS OFF" in output
    assert re.search(r"gateway_stopped", output)

    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({f"sk-{uuid.uuid4().hex}": {"peer_user_id": "x"}}))
    returncode, output, response = await run(str(keys))
    assert returncode == 0, output
    assert response.status_code == 401
    assert "AUTH IS OFF" not in output
