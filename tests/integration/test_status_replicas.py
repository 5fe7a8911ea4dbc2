"""`hookbus status` shows the work each replica takes: a third replica started beside a
running group's two is listed with the hops it ran, not only by its name."""

from __future__ import annotations

import asyncio

from hookbus import Agent
from hookbus.bus.wire.protocol_version import PROTOCOL
from hookbus.services.cli.monitor import Status, format_status, read_status
from hookbus.services.worker.host import GroupHost
from hookbus.services.worker.replica import WorkerReplica
from tests.integration.stack import running_stack
from tests.integration.test_bus_order_and_ops import SlowCounter
from tests.waiting import wait_for

REQUESTS = 40


async def test_status_shows_the_work_a_third_replica_takes(redis_url, prefix):
    async with running_stack(redis_url, prefix, Agent("load"), {"slow": [SlowCounter()]}, replicas=2) as (client, _, workers):
        third = WorkerReplica(GroupHost("slow", [SlowCounter()]), redis_url, prefix=prefix, concurrency=8, replica="slow-third")
        await third.start()
        try:
            await asyncio.gather(*(client.complete(f"hi {n}") for n in range(REQUESTS)))

            async def every_hop_recorded() -> Status | None:
                status = await read_status(client.redis, client.keys)
                [group] = [g for g in status.groups if g.name == "slow"]
                settled = sum(group.hops_last_minute.values()) == REQUESTS and group.pending == 0
                return status if settled else None

            # the event writers flush every few ms, and a replica's acks ride with its next reply
            # or go alone within 100 ms: "in flight" reads the group's pending entries
            status = await wait_for(every_hop_recorded)
        finally:
            await third.stop()
    assert status is not None
    [group] = status.groups
    ran = {w.replica: w.processed for w in [*workers, third]}
    assert group.hops_last_minute == ran and ran["slow-third"] > 0, ran
    shown = format_status(status)
    assert f"- slow-third (protocol {PROTOCOL}): {ran['slow-third']} hops in the last minute, 0 in flight" in shown, shown
