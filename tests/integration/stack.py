"""In-process bus stacks for integration tests: orchestrators and worker replicas as objects.

Tests that kill processes use tests/integration/processes.py instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from hookbus import Agent
from hookbus.bus.client import HookbusClient
from hookbus.services.orchestrator.serving import OrchestratorService
from hookbus.services.worker.host import GroupHost
from hookbus.services.worker.replica import WorkerReplica
from hookbus.skills import Context, HookData, Skill, hook, tool
from tests.waiting import wait_for


class Upper(Skill):
    """The worker-group skill the stack tests stream through: every chunk's text upper-cased."""

    name = "upper"

    @hook("on_chunk")
    def shout(self, data: HookData, ctx: Context) -> HookData:
        if data.content:
            data.content = data.content.upper()
        return data


class Notes(Skill):
    name = "notes"

    @tool
    def remember(self, note: str, ctx: Context) -> str:
        """Remember a note for this conversation."""
        ctx.session.data.setdefault("notes", []).append(note)
        return f"noted ({len(ctx.session.data['notes'])})"


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
    orchestrator_options: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[HookbusClient, list[OrchestratorService], list[WorkerReplica]]]:
    """`orchestrator_options` go to each OrchestratorService."""
    workers = [
        WorkerReplica(
            GroupHost(group, skills), redis_url, prefix=prefix, concurrency=8,
            replica=f"{group}-{n}", claim_idle=claim_idle,
        )
        for group, skills in (groups or {}).items()
        for n in range(replicas)
    ]
    services = [
        OrchestratorService(agent, redis_url, prefix=prefix, instance=f"orch-{n}", **(orchestrator_options or {}))
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

    async def ready() -> bool:
        enough = True
        for service in services:
            assert service.runtime is not None
            registry = service.runtime.registry
            await registry.refresh()
            enough = enough and len([g for g in registry.groups if registry.is_live(g)]) >= count
        return enough

    if not await wait_for(ready, timeout=timeout):
        raise TimeoutError(f"fewer than {count} live worker groups after {timeout} s")
