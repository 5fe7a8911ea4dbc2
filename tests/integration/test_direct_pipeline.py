"""The hop path's pipeline (hookbus.bus.connection.pipeline) over a real Redis: each command's
reply in its place, a refusal in its own place, and a cancelled pipeline never leaves a
reply behind for the connection's next user."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ResponseError

from hookbus.bus.connection.pipeline import Commands, execute
from hookbus.bus.connection.retrying import connect


async def test_replies_come_back_in_order_and_a_refusal_stays_in_its_place(redis_url, prefix):
    client = connect(redis_url)
    try:
        await client.set(f"{prefix}text", "x")
        commands = Commands()
        commands.xadd(f"{prefix}s", {b"n": b"1"})
        commands.xadd(f"{prefix}text", {b"n": b"2"})  # WRONGTYPE
        commands.xlen(f"{prefix}s")
        commands.xrange(f"{prefix}s")
        added, refused, length, entries = await execute(client, commands)
        assert isinstance(refused, ResponseError) and "WRONGTYPE" in str(refused)
        assert length == 1
        assert entries == [(added, {b"n": b"1"})]  # parsed as redis-py parses it
    finally:
        await client.aclose()


async def test_a_cancelled_pipeline_leaves_no_reply_for_the_next_one(redis_url, prefix):
    client = connect(redis_url, max_connections=1)  # the next pipeline gets the same pooled connection
    stream = f"{prefix}later"
    try:
        waiting = Commands()
        waiting.xread({stream: "$"}, block=5000)
        blocked = asyncio.create_task(execute(client, waiting))
        await asyncio.sleep(0.2)  # the blocking read is on the wire
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
        added = await client.xadd(stream, {b"n": b"1"})  # a read still on that connection would answer now
        commands = Commands()
        commands.xlen(stream)
        commands.xrange(stream)
        assert await execute(client, commands) == [1, [(added, {b"n": b"1"})]]
    finally:
        await client.aclose()
