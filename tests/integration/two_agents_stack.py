"""Two agents in-process for the agents-by-name tests: orchestrator services (each serving
the agents it is given) and one replica of each agent's own worker group
(tests/faults/two_agents.py: the support desk upper-cases, the billing ledger lower-cases)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

from hookbus import Agent
from hookbus.services.orchestrator.serving.service import OrchestratorService
from hookbus.services.worker.host import GroupHost
from hookbus.services.worker.replica import WorkerReplica
from tests.faults.two_agents import BillingLedger, SupportDesk
from tests.integration.stack import wait_for_groups


@contextlib.asynccontextmanager
async def two_agents(
    redis_url: str, prefix: str, served: dict[str, Sequence[Agent]]
) -> AsyncIterator[dict[str, OrchestratorService]]:
    """Orchestrators (instance -> the agents it serves) and one replica of each agent's group."""
    workers = [
        WorkerReplica(GroupHost(group, [skill]), redis_url, prefix=prefix, replica=f"{group}-1", claim_idle=5)
        for group, skill in (("desk", SupportDesk()), ("ledger", BillingLedger()))
    ]
    services = {
        name: OrchestratorService(list(agents), redis_url, prefix=prefix, instance=name) for name, agents in served.items()
    }
    for worker in workers:
        await worker.start()
    for service in services.values():
        await service.start()
    try:
        await wait_for_groups(list(services.values()), 2)
        yield services
    finally:
        for service in services.values():
            await service.stop()
        for worker in workers:
            await worker.stop()
