"""The response stream's TTL: set by the first batch, renewed by `finish` (not once per batch)."""

from __future__ import annotations

import time

from hookbus.bus.connection import connect
from hookbus.bus.journal import Journal
from hookbus.bus.keys import Keys


async def test_the_first_batch_sets_the_ttl_and_finish_renews_it(redis_url, prefix):
    redis = connect(redis_url)
    keys = Keys(prefix)
    journal = Journal(redis, keys)
    cid, stream = "chatcmpl-ttl", keys.responses("chatcmpl-ttl")
    try:
        await redis.xadd(keys.requests_for(cid), {"e": b"{}"}, id="1-0")
        await journal.begin(cid, "1-0", "orch-a", now=time.time())
        assert await journal.write(cid, stream, 1, [b"a"], ttl=100, first_seq=0) == 1
        assert 0 < await redis.ttl(stream) <= 100
        await redis.expire(stream, 50)  # had later batches set it again, it would be 100 after them
        assert await journal.write(cid, stream, 1, [b"b", b"c"], ttl=100, first_seq=1) == 3
        assert 0 < await redis.ttl(stream) <= 50
        await journal.finish(
            cid, stream, 1, [b"done"], ttl=100, requests=keys.requests_for(cid), group="orchestrators",
            entry_id="1-0", first_seq=3,
        )
        assert 50 < await redis.ttl(stream) <= 100
        assert await redis.xlen(stream) == 4
    finally:
        await redis.aclose()
