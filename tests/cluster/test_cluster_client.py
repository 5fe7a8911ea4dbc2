"""Cluster detection and the journal scripts on a real Redis Cluster."""

from __future__ import annotations

import time
import uuid

from redis.asyncio.cluster import RedisCluster

from hookbus.bus.connection.cluster import is_cluster, keys_for
from hookbus.bus.connection.retrying import connect
from hookbus.bus.keys import ORCHESTRATOR_GROUP
from hookbus.bus.store.journal import Journal
from hookbus.bus.wire.envelopes import ResponseItem, encode
from tests.embedded_cluster import EmbeddedCluster


def test_any_node_of_a_cluster_is_detected_and_a_single_redis_is_not(
    redis_cluster: EmbeddedCluster, redis_url: str
) -> None:
    assert all(is_cluster(redis_cluster.node_url(port)) for port in redis_cluster.ports)
    assert not is_cluster(redis_url)
    assert keys_for(redis_cluster.url, "hookbus:").cluster
    assert not keys_for(redis_url, "hookbus:").cluster


async def test_a_request_runs_its_journal_scripts_atomically_on_whichever_node_holds_it(
    redis_cluster: EmbeddedCluster, prefix: str
) -> None:
    """begin -> write -> finish (which acks the requests shard) for requests on every
    shard: each script's keys share a slot, so none is refused as CROSSSLOT."""
    keys = keys_for(redis_cluster.url, prefix)
    client = connect(redis_cluster.url)
    assert isinstance(client, RedisCluster)
    journal = Journal(client, keys)
    try:
        for shard in range(keys.shards):
            cid = next(c for c in (f"chatcmpl-{uuid.uuid4().hex}" for _ in range(1000)) if keys.shard_of(c) == shard)
            stream = keys.requests_for(cid)
            await client.xgroup_create(stream, ORCHESTRATOR_GROUP, id="0", mkstream=True)
            entry = (await client.xadd(stream, {"e": b"{}"})).decode()
            await client.xreadgroup(ORCHESTRATOR_GROUP, "me", {stream: ">"}, count=1)
            begun = await journal.begin(cid, entry, "me", now=time.time())
            assert begun.ok and begun.epoch == 1
            item = ResponseItem(kind="chunk", completion_id=cid, chunk={})
            assert await journal.write(cid, keys.responses(cid), 1, [item], ttl=60, first_seq=0) == 1
            done = ResponseItem(kind="done", completion_id=cid)
            written = await journal.finish(
                cid, keys.responses(cid), 1, [done], ttl=60, requests=stream,
                group=ORCHESTRATOR_GROUP, entry_id=entry, first_seq=1,
            )
            assert written == 2
            assert (await client.xpending(stream, ORCHESTRATOR_GROUP))["pending"] == 0
            assert (await journal.read(cid))["done"] == "1"
    finally:
        await client.aclose()


async def test_status_sums_the_backlog_of_every_shard(redis_cluster: EmbeddedCluster, prefix: str) -> None:
    """`hookbus status` (and KEDA's summed trigger) see one queue, not twelve."""
    from hookbus.bus.client import HookbusClient
    from hookbus.bus.connection.retrying import ensure_group
    from hookbus.services.cli.monitor import read_status

    async with HookbusClient(redis_cluster.url, prefix=prefix) as client:
        for stream in client.keys.request_streams:
            await ensure_group(client.redis, stream, ORCHESTRATOR_GROUP)
        requests = [await client.submit(f"queued {n}") for n in range(30)]
        status = await read_status(client.redis, client.keys)
        shards = {client.keys.shard_of(r.completion_id) for r in requests}
    assert len(shards) > 6
    assert status.requests_lag == 30 and status.requests_pending == 0


async def test_a_request_queued_on_another_shard_is_refused_with_a_400(redis_cluster: EmbeddedCluster, prefix: str) -> None:
    from hookbus import Agent
    from hookbus.bus.wire.envelopes import RequestEnvelope
    from hookbus.skills import HookError
    from tests.integration.stack import running_stack

    async with running_stack(redis_cluster.url, prefix, Agent("cluster")) as (client, _, _):
        request = RequestEnvelope(completion_id=f"chatcmpl-{uuid.uuid4().hex}", messages=[{"role": "user", "content": "hi"}],
                                  deadline=time.time() + 30)
        wrong = next(s for s in client.keys.request_streams if s != client.keys.requests_for(request.completion_id))
        await client.redis.xadd(wrong, encode(request))  # type: ignore[arg-type]
        items = [item async for item in client.items(request)]
    assert items[-1].kind == "error"
    error = HookError.from_dict(items[-1].error or {})
    assert error.status_code == 400 and error.code == "misrouted_request"


async def test_on_a_cluster_reads_do_not_ride_and_every_hop_is_answered(
    redis_cluster: EmbeddedCluster, prefix: str
) -> None:
    """A blocking read in a cluster pipeline would hold back that node's part of it, so
    neither the worker's nor the router's reads ride there (hookbus.bus.hops.pipelined_read)."""
    from hookbus.bus.hops.reply_router import ReplyRouter
    from hookbus.services.worker.host import GroupHost
    from hookbus.services.worker.replica import WorkerReplica
    from tests.integration.test_reply_refused import Quick, hop

    keys = keys_for(redis_cluster.url, prefix)
    worker = WorkerReplica(GroupHost("quick", [Quick()]), redis_cluster.url, prefix=prefix, replica="q-c")
    router = ReplyRouter(
        connect(redis_cluster.url), connect(redis_cluster.url, retries=0), keys.replies("orch-c")
    )
    await worker.start()
    await router.start()
    try:
        for n in range(10):
            event = hop(n, router.reply_stream)
            event.completion_id = f"chatcmpl-{n}"
            reply = await router.call(keys.hooks_for("quick", event.completion_id), event, timeout=10)
            assert reply.hop_id == f"hop-{n}" and not reply.failure
        assert router.rides == 0
        assert worker._reader is not None and worker._reader.rides == 0
    finally:
        await router.stop()
        await worker.stop()
