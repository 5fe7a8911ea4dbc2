"""Observers in a worker group on a real 3-master Redis Cluster: each request's entry goes
to the observer-stream shard of its own slot, and every shard is read."""

from __future__ import annotations

import asyncio

from hookbus import Agent
from hookbus.bus.groups.observer_backlog import BacklogBound
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


async def test_a_stopped_observer_group_is_bounded_on_every_shard_of_a_cluster(
    redis_cluster: EmbeddedCluster, prefix: str
) -> None:
    """The bound is split over the shards; each shard's script runs in its own slot, and
    the drops of every shard add up in the one counter."""
    options = {"observe_bound": BacklogBound(max_entries=12, max_bytes=10**9)}
    async with running_stack(
        redis_cluster.url, prefix, Agent("cluster-bound"), {"audit": [Audit()]}, orchestrator_options=options
    ) as (client, services, workers):
        await workers[0].stop()
        await asyncio.gather(*(client.complete(f"[[echo]] request {n}") for n in range(40)))
        await services[0].bound_observer_backlogs()
        keys = services[0].keys
        streams = keys.observe_streams("audit")
        per_shard = max(1, 12 // len(streams))
        lengths = [await client.redis.xlen(stream) for stream in streams]
        dropped = int(await client.redis.hget(keys.observe_dropped, "audit"))
    assert len(streams) > 1 and max(lengths) <= per_shard
    assert dropped + sum(lengths) == 40 and dropped > 0
