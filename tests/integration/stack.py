"""In-process bus stacks for integration tests: orchestrators and worker replicas as objects.

Tests that kill processes use tests/integration/processes.py instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from hookbus import Agent
from hookbus.bus.client import HookbusClient
from hookbus.services.orchestrator.service import OrchestratorService
from hookbus.services.worker.host import GroupHost
from hookbus.services.worker.replica import WorkerReplica
from hookbus.skills import Context, HookData, Skill, hook


class Upper(Skill):
    """The worker-group skill the stack tests stream through: every chunk's text upper-cased."""

    name = "upper"

    @hook("on_chunk")
    def shout(self, data: HookData, ctx: Context) -> HookData:
        if data.content:
            data.content = data.content.upper()
        return data


@contextlib.asynccontextmanager
async def running_stack(
    redis_url: str,
    prefix: str,
    agent: Agent,
    groups: dict[str, Sequence[Skill]] | None = None,
    *,
    replicas: int = 1,
    orchestrators: int = 1,
    claim_idle: float = 5.0,
) -> AsyncIterator[tuple[HookbusClient, list[OrchestratorService], list[WorkerReplica]]]:
    workers = [
        WorkerReplica(
            GroupHost(group, skills), redis_url, prefix=prefix, concurrency=8,
            replica=f"{group}-{n}", claim_idle=claim_idle,
        )
        for group, skills in (groups or {}).items()
        for n in range(replicas)
    ]
    services = [
        OrchestratorService(agent, redis_url, prefix=prefix, instance=f"orch-{n}")
        for n in range(orchestrators)
    ]
    for worker in workers:
        await worker.start()
    for service in services:
        await service.start()
    await wait_for_groups(services, len(groups or {}))
    client = HookbusClient(redis_url, prefix=prefix, timeout=30)
    try:
        yield client, services, workers
    finally:
        await client.close()
        for service in services:
            await service.stop()
        for worker in workers:
            await worker.stop()


async def wait_for_groups(services: Sequence[OrchestratorService], count: int, timeout: float = 5.0) -> None:
    """Until every orchestrator's registry view has `count` live groups."""
    async with asyncio.timeout(timeout):
        while True:
            ready = True
            for service in services:
                assert service.runtime is not None
                await service.runtime.registry.refresh()
                live = [g for g in service.runtime.registry.groups if service.runtime.registry.is_live(g)]
                ready = ready and len(live) >= count
            if ready:
                return
            await asyncio.sleep(0.05)
