"""`hookbus conformance -- COMMAND`: the kit's bus, orchestrator and reference group, the
worker under test as a process, and the checks run against them one by one.

The kit starts an embedded Redis, an orchestrator (in this process, on the built-in offline
model, whatever OPENAI_BASE_URL says) whose agent has the `Recorder` skill, and the
reference group `conformance-reference` (in this process). Then it runs COMMAND with
REDIS_URL, HOOKBUS_PREFIX and HOOKBUS_GROUP=conformance added to its environment; the
command must start one replica of the group `conformance` hosting the `Probe` skill (or its
twin in another language). The checks (hookbus.services.protocol.conformance.checks) print
`PASS name` or `FAIL name: why`, one line each, then `conformance: N passed, N failed`;
the exit status is 1 if any failed.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Sequence

from hookbus import Agent
from hookbus.bus.connection.embedded import EmbeddedRedis
from hookbus.services.observability.logs import configure_logging
from hookbus.services.orchestrator.llm.client import LLM
from hookbus.services.orchestrator.serving import OrchestratorService
from hookbus.services.protocol.conformance.checks import CHECKS, KILL_CHECK
from hookbus.services.protocol.conformance.harness import Check, CheckFailed, Harness, until_served
from hookbus.services.protocol.conformance.skills import (
    GROUP,
    KIT_MAX_HOP_BYTES,
    KIT_MAX_STATE_BYTES,
    REFERENCE_GROUP,
    Recorder,
    Reference,
)
from hookbus.services.protocol.conformance.worker_process import WorkerProcess
from hookbus.services.testing.offline_server import shared_offline_base_url
from hookbus.services.worker.host import GroupHost
from hookbus.services.worker.replica import WorkerReplica

CHECK_TIMEOUT = 90.0
"""Seconds one check may take: a worker that never answers fails it instead of stalling the kit."""


def run_kit(command: Sequence[str], *, include_kill: bool = True, only: Sequence[str] = ()) -> int:
    """Run the checks (those named in `only`, else all; the kill one unless `include_kill` is
    False) against the worker COMMAND starts; 0 when all passed, 2 for an unknown check name."""
    checks = [*CHECKS, *([KILL_CHECK] if include_kill or KILL_CHECK[0] in only else [])]
    unknown = set(only) - {name for name, _ in checks}
    if unknown:
        print(f"unknown checks: {', '.join(sorted(unknown))}; the checks: {', '.join(n for n, _ in checks)}", file=sys.stderr)
        return 2
    configure_logging(level="critical")  # the kit's own services stay quiet; its lines are the output
    return asyncio.run(_run(command, [c for c in checks if not only or c[0] in only]))


async def _run(command: Sequence[str], checks: Sequence[tuple[str, Check]]) -> int:

    redis = EmbeddedRedis(appendonly=False)
    redis.start()
    prefix = f"conformance-{uuid.uuid4().hex[:8]}:"
    env = {
        **os.environ, "REDIS_URL": redis.url, "HOOKBUS_PREFIX": prefix, "HOOKBUS_GROUP": GROUP,
        "HOOKBUS_MAX_HOP_BYTES": str(KIT_MAX_HOP_BYTES), "HOOKBUS_MAX_STATE_BYTES": str(KIT_MAX_STATE_BYTES),
    }
    env.pop("HOOKBUS_WORKER_VERSION", None)
    worker = WorkerProcess(command, env)
    reference = WorkerReplica(GroupHost(REFERENCE_GROUP, [Reference()]), redis.url, prefix=prefix, replica="reference-0")
    agent = Agent("conformance", model="offline", skills=[Recorder()], llm=LLM(base_url=shared_offline_base_url()))
    orchestrator = OrchestratorService(agent, redis.url, prefix=prefix, instance="conformance-orchestrator")
    harness = Harness(redis.url, prefix, worker)
    failures = 0
    try:
        await reference.start()
        await orchestrator.start()
        try:
            try:
                worker.start()
            except OSError as exc:
                raise CheckFailed(f"cannot start {' '.join(command)}: {exc}") from exc
            await harness.wait_for_worker()
            await until_served(orchestrator)
        except CheckFailed as exc:
            print(f"FAIL worker_started: {exc}", flush=True)
            return 1
        for name, check in checks:
            try:
                await asyncio.wait_for(check(harness), CHECK_TIMEOUT)
            except TimeoutError:
                failures += 1
                print(f"FAIL {name}: no verdict in {CHECK_TIMEOUT:g} s (a hop never answered?)", flush=True)
            except CheckFailed as exc:
                failures += 1
                print(f"FAIL {name}: {exc}", flush=True)
            else:
                print(f"PASS {name}", flush=True)
    finally:
        await harness.client.close()
        await orchestrator.stop()
        await asyncio.to_thread(worker.stop)
        await reference.stop()
        redis.cleanup()
    print(f"conformance: {len(checks) - failures} passed, {failures} failed", flush=True)
    if failures:
        print(f"{failures} of {len(checks)} checks failed; the worker's output: {worker.log_path}", file=sys.stderr)
        return 1
    worker.log_path.unlink(missing_ok=True)  # kept only to explain a failure
    return 0

