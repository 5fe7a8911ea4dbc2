"""The response stream's TTL: set by the first batch, renewed by `finish` (not once per
batch), and not even by `finish` when the writer's own first batch set it moments ago."""

from __future__ import annotations

import time

from hookbus.bus.connection.retrying import connect
from hookbus.bus.keys import Keys
from hookbus.bus.store.journal import Journal
from hookbus.bus.store.response_stream import Ack, Fence, ResponseWriter
from hookbus.bus.wire.envelopes import ResponseItem
from tests.waiting import wait_for


def chunk(cid: str, text: str) -> ResponseItem:
    return ResponseItem(kind="chunk", completion_id=cid, chunk={"text": text})


async def test_the_first_batch_sets_the_ttl_and_finish_renews_it(redis_url, prefix):
    redis = connect(redis_url)
    keys = Keys(prefix)
    journal = Journal(redis, keys)
    cid, stream = "chatcmpl-ttl", keys.responses("chatcmpl-ttl")
    try:
        await redis.xadd(keys.requests_for(cid), {"e": b"{}"}, id="1-0")
        await journal.begin(cid, "1-0", "orch-a", now=time.time())
        assert await journal.write(cid, stream, 1, [chunk(cid, "a")], ttl=100, first_seq=0) == 1
        assert 0 < await redis.ttl(stream) <= 100
        await redis.expire(stream, 50)  # had later batches set it again, it would be 100 after them
        assert await journal.write(cid, stream, 1, [chunk(cid, "b"), chunk(cid, "c")], ttl=100, first_seq=1) == 3
        assert 0 < await redis.ttl(stream) <= 50
        await journal.finish(
            cid, stream, 1, [ResponseItem(kind="done", completion_id=cid)], ttl=100,
            requests=keys.requests_for(cid), group="orchestrators", entry_id="1-0", first_seq=3,
        )
        assert 50 < await redis.ttl(stream) <= 100
        assert await redis.xlen(stream) == 3  # one entry per write
    finally:
        await redis.aclose()


async def _stream_ttl_after_finish(redis_url: str, prefix: str, first_seq: int) -> int:
    """Runs a fenced writer starting at `first_seq` (0: a new run; -1: a recovery, which
    does not know who set the TTL), cuts the TTL to 50 s after its first batch, finishes:
    returns the TTL then."""
    redis = connect(redis_url)
    keys = Keys(prefix)
    journal = Journal(redis, keys)
    cid = f"chatcmpl-ttl{first_seq}"
    stream, requests = keys.responses(cid), keys.requests_for(cid)
    try:
        await redis.xadd(requests, {"e": b"{}"}, id="1-0")
        await redis.xgroup_create(requests, "orchestrators", id="0")
        await journal.begin(cid, "1-0", "orch-a", now=time.time())
        writer = ResponseWriter(redis, stream, ttl=100, fence=Fence(journal, cid, 1), first_seq=first_seq)
        if first_seq < 0:  # the stream the lost owner left, its TTL set long ago
            await journal.write(cid, stream, 1, [chunk(cid, "a")], ttl=100, first_seq=0)
        else:
            writer.add(chunk(cid, "a"))
            assert await wait_for(lambda: redis.exists(stream))
        await redis.expire(stream, 50)
        assert await writer.finish(ResponseItem(kind="done", completion_id=cid), ack=Ack(requests, "orchestrators", "1-0"))
        return int(await redis.ttl(stream))
    finally:
        await redis.aclose()


async def test_finish_leaves_the_ttl_a_fresh_first_batch_of_its_own_writer_set(redis_url, prefix):
    assert 0 < await _stream_ttl_after_finish(redis_url, prefix, first_seq=0) <= 50


async def test_finish_renews_the_ttl_when_the_writer_did_not_set_it(redis_url, prefix):
    assert 50 < await _stream_ttl_after_finish(redis_url, prefix, first_seq=-1) <= 100
