"""Observers in a worker group on a real 3-master Redis Cluster: each request's entry goes
to the observer-stream shard of its own slot, and every shard is read."""

from __future__ import annotations

import asyncio

from hookbus import Agent
from tests.embedded_cluster import EmbeddedCluster
from tests.integration.stack import running_stack
from tests.integration.test_observers_bus import Audit
from tests.waiting import wait_for


async def test_group_observers_see_every_request_on_a_cluster(redis_cluster: EmbeddedCluster, prefix: str) -> None:
    audit = Audit()
    async with running_stack(redis_cluster.url, prefix, Agent("cluster-obs"), {"audit": [audit]}) as (client, _, workers):
        completions = await asyncio.gather(*(client.complete(f"[[echo]] request {n}") for n in range(12)))
        ids = {c.id for c in completions}

        async def all_finalized() -> bool:
            return ids <= {s["cid"] for s in audit.seen if s["lifecycle"] == "finalize_connection"}

        assert await wait_for(all_finalized, timeout=15)
        observer = workers[0].observer
        assert observer is not None and len(observer.streams) > 1  # one per shard
    for cid in ids:
        assert [s["lifecycle"] for s in audit.seen if s["cid"] == cid] == ["on_connection", "finalize_connection"]
