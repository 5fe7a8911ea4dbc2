"""`hookbus orchestrator` serves a real LLM endpoint, or the offline stand-in model only
when asked for it by name (`HOOKBUS_MODEL=offline`); with neither it refuses to start."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import redis.asyncio as aredis

from hookbus.bus.client import HookbusClient
from hookbus.bus.keys import Keys
from tests.integration.processes import REPO, Processes

DEMO_AGENT = "hookbus.services.orchestrator.demo:agent"


def without_endpoint(service_env: dict[str, str]) -> dict[str, str]:
    """The test's environment with no LLM endpoint and no model named."""
    return {k: v for k, v in service_env.items() if k not in ("OPENAI_BASE_URL", "HOOKBUS_MODEL")}


async def test_orchestrator_without_an_endpoint_refuses_to_start_naming_openai_base_url(
    service_env, redis_url, prefix
):
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "hookbus.services.cli.main", "orchestrator", "--agent", DEMO_AGENT,
         "--instance", "orch-no-endpoint"],
        env=without_endpoint(service_env), cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode != 0, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("hookbus orchestrator: no LLM endpoint"), lines[0]
    assert "OPENAI_BASE_URL" in lines[0] and "HOOKBUS_MODEL=offline" in lines[0]
    assert "Traceback" not in done.stdout + done.stderr
    redis = aredis.Redis.from_url(redis_url)
    try:  # it never joined the orchestrators
        assert await redis.zscore(Keys(prefix).orchestrators, "orch-no-endpoint") is None
    finally:
        await redis.aclose()


async def test_orchestrator_with_hookbus_model_offline_starts_and_answers(
    service_env, redis_url, prefix, tmp_path
):
    procs = Processes(dict(without_endpoint(service_env), HOOKBUS_MODEL="offline"), tmp_path)
    try:
        orchestrator = procs.orchestrator(DEMO_AGENT, instance="orch-offline")
        await procs.wait_ready(orchestrator)
        async with HookbusClient(redis_url, prefix=prefix, timeout=30) as client:
            completion = await client.complete("[[echo]] asked for by name")
        assert completion.model == "offline"
        assert completion.choices[0].message.content == "asked for by name"
    finally:
        procs.close()
