"""Requests of every kind through a real 3-master Redis Cluster, and the load spread.

The stack (orchestrators, worker groups, client) is the one of the integration tests,
given any one node's URL; hookbus detects the cluster and shards its keys.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from hookbus import Agent, CompactionPolicy
from hookbus.bus.connection.shards import slot_of
from hookbus.bus.groups.versions import serving_counts
from hookbus.services.gateway.cancel import request_cancel
from tests.cluster.skills import Ledger, RemoteCounter, TagA, TagB
from tests.conversations import conversation
from tests.embedded_cluster import EmbeddedCluster
from tests.integration.stack import Notes, Upper, running_stack
from tests.waiting import wait_for


def commandstats(cluster: EmbeddedCluster) -> dict[int, dict[str, int]]:
    """Per master: calls of each command so far."""
    stats = {}
    for port in cluster.master_ports():
        with cluster.client(port) as node:
            raw: dict[str, Any] = node.info("commandstats")
            stats[port] = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in raw.items()}
    return stats


async def test_requests_of_every_kind_are_answered_on_a_cluster(redis_cluster: EmbeddedCluster, prefix: str) -> None:
    ledger = Ledger()
    agent = Agent("cluster", skills=[ledger], compaction_policy=CompactionPolicy(window=1000))
    remote = RemoteCounter()
    groups = {"shout": [Upper()], "notes": [Notes()], "mem": [remote]}
    async with running_stack(redis_cluster.url, prefix, agent, groups, orchestrators=2) as (client, _, workers):
        streamed = [client.stream(f"[[words:5]] {n}") for n in range(24)]
        texts = await asyncio.gather(*(_text(s) for s in streamed))
        finals = await asyncio.gather(*(client.complete(f"[[echo]] plain {n}") for n in range(6)))
        tool = await client.complete('[[tool:remember {"note": "a"}]]', session_id=f"s-{uuid.uuid4().hex}")
        outcome = await agent.compact(conversation(3))

        request = await client.submit("[[delay:200]] [[words:60]]", stream=True)
        items = client.items(request)
        first = await anext(items)
        assert await request_cancel(client.redis, client.keys, request.completion_id)
        rest = [item async for item in items]

    assert texts == ["W0 W1 W2 W3 W4"] * 24  # every chunk went through the remote on_chunk hook
    assert [f.choices[0].message.content for f in finals] == [f"plain {n}" for n in range(6)]
    assert tool.choices[0].message.content == "The tool remember returned: noted (1)"
    assert outcome.stage == "summarized" and remote.calls == [outcome.id]
    assert first.kind == "chunk" and rest[-1].kind == "error" and rest[-1].error["status_code"] == 499
    # finalize ran exactly once for every request, the cancelled one with its 499
    assert len(ledger.finalized) == 24 + 6 + 1 + 1 == len({cid for cid, _ in ledger.finalized})
    assert dict(ledger.finalized)[request.completion_id] == 499
    assert sum(w.processed for w in workers) >= 24  # at least one on_chunk hop per stream
    # the requests were spread over the shards (completion ids are random)
    assert len({client.keys.shard_of(cid) for cid, _ in ledger.finalized}) >= 8


async def test_a_stage_is_sent_on_from_group_to_group_across_the_masters(redis_cluster: EmbeddedCluster, prefix: str) -> None:
    """Each request's hops go to its own shard: a worker sends the stage on to the other
    group's shard stream on whichever master holds it (a cluster pipeline, no ride)."""
    groups = {"group-a": [TagA()], "group-b": [TagB()]}
    async with running_stack(redis_cluster.url, prefix, Agent("cluster"), groups, orchestrators=2) as (client, services, _):
        answers = await asyncio.gather(*(client.complete(f"[[echo]] {n}") for n in range(16)))
        keys = client.keys
        versions = {group: list(services[0].runtime.registry.versions[group]) for group in groups}

        async def released() -> bool:  # else a stopping last replica waits out its drain limit
            counts = [await serving_counts(client.redis, keys, g, v) for g, v in versions.items()]
            return all(n == 0 for c in counts for n in c.values())

        assert all(versions.values()) and await wait_for(released, timeout=30)
    assert [a.choices[0].message.content for a in answers] == [f"{n} +a +b" for n in range(16)]
    assert sum(s.runtime.forwarded for s in services) == 16  # every on_connection, by group-a's worker
    assert len({keys.shard_of(a.id) for a in answers}) >= 4


async def test_commands_spread_over_every_master(redis_cluster: EmbeddedCluster, prefix: str) -> None:
    before = commandstats(redis_cluster)
    agent = Agent("cluster")
    async with running_stack(redis_cluster.url, prefix, agent, {"shout": [Upper()]}, orchestrators=3) as (client, _, _):
        for _round in range(3):
            await asyncio.gather(*(_text(client.stream("[[words:8]]")) for _ in range(30)))
        keys = client.keys
    after = commandstats(redis_cluster)
    # XADD (requests, hops, replies, events; response batches inside the journal scripts)
    # and EVALSHA (the journal scripts) on every master
    xadds = {port: after[port].get("xadd", 0) - before[port].get("xadd", 0) for port in after}
    scripts = {port: after[port].get("evalsha", 0) - before[port].get("evalsha", 0) for port in after}
    total = sum(xadds.values())
    assert total > 90 * (1 + 1 + 2), xadds  # each request, a response batch, a hop and its reply at least
    assert all(count > 0.15 * total for count in xadds.values()), xadds
    assert all(count > 0.15 * sum(scripts.values()) for count in scripts.values()), scripts
    # the shards themselves are spread evenly over the three masters
    masters = [redis_cluster.master_of_slot(slot_of(stream)) for stream in keys.request_streams]
    assert sorted(masters.count(port) for port in set(masters)) == [4, 4, 4]


async def _text(chunks: Any) -> str:
    return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])

