"""Redis at `maxmemory` (policy noeviction): a new request gets a clear 503, from the
gateway and from `hookbus send` (no traceback), the services log the trouble once when
it starts, not a traceback every second or two, and an orchestrator started meanwhile
waits for memory instead of exiting."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import httpx
import pytest
import redis

from hookbus.bus.client import HookbusClient
from hookbus.bus.embedded import EmbeddedRedis
from hookbus.skills import HookError
from tests.gateway.server import running_gateway
from tests.integration.processes import REPO, Processes

pytestmark = pytest.mark.slow


def fill(url: str) -> None:
    """Put Redis over its maxmemory for good: fill it, then lower maxmemory below its use."""
    with redis.Redis.from_url(url) as client:
        for n in range(40):
            client.set(f"filler:{n}", b"x" * 100_000)
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", str(used // 2))
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("one-more", "x")


async def test_a_full_redis_answers_503_and_the_services_log_it_once(tmp_path, service_env) -> None:
    server = EmbeddedRedis(directory=tmp_path / "redis", appendonly=False)
    server.start()
    prefix = "oom:"
    env = dict(service_env, REDIS_URL=server.url, HOOKBUS_PREFIX=prefix)
    procs = Processes(env, tmp_path / "logs")
    try:
        orchestrator = procs.orchestrator("tests.faults.fault_skills:agent", instance="orch-oom", claim_idle=1)
        await procs.wait_ready(orchestrator)
        fill(server.url)
        await asyncio.sleep(4)  # heartbeats, leases, events: every loop meets the OOM

        async with HookbusClient(server.url, prefix=prefix) as client:
            with pytest.raises(HookError) as refused:
                await client.complete("hi")
        assert refused.value.status_code == 503 and refused.value.code == "redis_out_of_memory"

        async with (
            running_gateway(server.url, prefix, models=["offline"]) as gateway,
            httpx.AsyncClient(base_url=gateway.url, timeout=30) as http,
        ):
            response = await http.post(
                "/v1/chat/completions",
                json={"model": "offline", "messages": [{"role": "user", "content": "hi"}]},
            )
        assert response.status_code == 503
        assert "out of memory" in response.json()["error"]["message"]

        sent = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "hookbus.services.cli", "send", "hi"],
            env={**os.environ, "REDIS_URL": server.url, "HOOKBUS_PREFIX": prefix},
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )
        assert sent.returncode == 1
        assert "error 503 redis_out_of_memory" in sent.stderr and "Traceback" not in sent.stderr

        late = procs.orchestrator("tests.faults.fault_skills:agent", instance="orch-late", claim_idle=1)
        await asyncio.sleep(3)  # started during the OOM: it waits, it does not exit
        assert late.alive and "waiting_for_redis_memory" in late.log_tail(200), late.log_tail(50)

        log = orchestrator.log_tail(10_000)
        assert "Traceback" not in log, log[-3000:]
        assert log.count("heartbeat_failing") == 1, log[-3000:]
        assert orchestrator.alive

        with redis.Redis.from_url(server.url) as admin:  # memory is freed
            admin.config_set("maxmemory", "0")
        await procs.wait_ready(late)
        async with HookbusClient(server.url, prefix=prefix) as client:
            assert (await client.complete("[[echo]] back")).choices[0].message.content == "back"
        assert "heartbeat_recovered" in orchestrator.log_tail(10_000)
    finally:
        procs.close()
        server.cleanup()
