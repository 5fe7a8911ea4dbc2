"""Hops sent in one event-loop turn go in one pipeline; a refused entry fails alone."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ResponseError

from hookbus.bus.connection.batched_appends import StreamAppender
from hookbus.bus.connection.retrying import RECONNECT_ERRORS, connect


async def test_entries_of_one_turn_share_a_pipeline_and_a_refusal_fails_only_its_caller(redis_url, prefix):
    redis = connect(redis_url)
    appender = StreamAppender(redis)
    try:
        await redis.set(f"{prefix}not-a-stream", "x")
        streams = [f"{prefix}s{n % 3}" for n in range(30)]
        results = await asyncio.gather(
            *(appender.add(s, {b"n": str(n).encode()}) for n, s in enumerate(streams)),
            appender.add(f"{prefix}not-a-stream", {b"n": b"bad"}),
            return_exceptions=True,
        )
        assert results[:30] == [None] * 30
        assert isinstance(results[30], ResponseError) and "WRONGTYPE" in str(results[30])
        assert appender.pipelines == 1
        assert [await redis.xlen(f"{prefix}s{k}") for k in range(3)] == [10, 10, 10]
        entries = await redis.xrange(f"{prefix}s1")
        assert [int(f[b"n"]) for _, f in entries] == list(range(1, 30, 3))  # in the callers' order
        await appender.add(f"{prefix}alone", {b"n": b"1"})  # a later turn: a pipeline of its own
        assert appender.pipelines == 2 and await redis.xlen(f"{prefix}alone") == 1
        unreachable = connect("redis://127.0.0.1:1/0", retries=0)
        with pytest.raises(RECONNECT_ERRORS):  # Redis unreachable: the caller hears it
            await StreamAppender(unreachable).add(f"{prefix}x", {b"n": b"1"})
        await unreachable.aclose()
    finally:
        await redis.aclose()
