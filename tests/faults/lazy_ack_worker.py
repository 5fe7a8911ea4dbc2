"""A worker replica of group `slow` (tests.faults.fault_skills.Slow) whose acks wait an
hour: SIGKILLed after it replied, the hops it answered are still pending, as after a
crash between a reply and its ack. Run as `python -m tests.faults.lazy_ack_worker`."""

from __future__ import annotations

import asyncio
import os

from hookbus.services.observability.logs import configure_logging
from hookbus.services.worker.host import GroupHost
from hookbus.services.worker.replica import WorkerReplica
from tests.faults.fault_skills import NAME, Slow


def main() -> None:
    configure_logging()
    replica = WorkerReplica(
        GroupHost("slow", [Slow()]), os.environ["REDIS_URL"], prefix=os.environ["HOOKBUS_PREFIX"],
        replica=NAME, claim_idle=1.0, ack_delay=3600.0,
    )
    asyncio.run(replica.app.run())


if __name__ == "__main__":
    main()
