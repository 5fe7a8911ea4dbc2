"""A worker replies at once and acks later (ReplyBatcher): the ack rides with the next
replies or goes on its own within the bound, and never before its reply."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from hookbus.bus.connection.retrying import connect, ensure_group
from hookbus.bus.keys import Keys
from hookbus.bus.wire.envelopes import HopReply, decode, encode
from hookbus.services.worker.host import GroupHost
from hookbus.services.worker.replica import ReplyBatcher, WorkerReplica
from tests.integration.test_reply_refused import Quick, hop
from tests.waiting import wait_for


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator:
    client = connect(redis_url)
    yield client
    await client.aclose()


async def delivered(redis, stream: str, group: str, count: int) -> list[str]:  # type: ignore[no-untyped-def]
    """`count` entries added to `stream` and read by `group` (pending, as a worker holds them)."""
    await ensure_group(redis, stream, group)
    for n in range(count):
        await redis.xadd(stream, {"n": str(n)})
    response = await redis.xreadgroup(group, "me", {stream: ">"}, count=count)
    return [entry_id.decode() for entry_id, _ in response[0][1]]


async def pending_ids(redis, stream: str, group: str) -> set[str]:  # type: ignore[no-untyped-def]
    return {p["message_id"].decode() for p in await redis.xpending_range(stream, group, "-", "+", 1000)}


async def test_a_reply_is_written_at_once_and_its_ack_follows_within_the_bound(redis, prefix):
    stream, reply_to = f"{prefix}hooks", f"{prefix}replies"
    (entry,) = await delivered(redis, stream, "g", 1)
    batcher = ReplyBatcher(redis, "g", ack_delay=0.05)
    await batcher.send(reply_to, {"e": "reply"}, (stream, entry))
    replied = time.monotonic()
    assert await redis.xlen(reply_to) == 1
    assert await pending_ids(redis, stream, "g") == {entry}  # the ack is owed, not sent

    async def acked() -> bool:
        return not await pending_ids(redis, stream, "g")

    assert await wait_for(acked, timeout=2, every=0.005)
    assert time.monotonic() - replied < 0.05 + 0.45  # the delay and a loaded machine's scheduling, not a later flush
    assert batcher.unacked == 0


async def test_the_acks_of_replies_sent_apart_go_together_in_one_xack(redis, prefix):
    stream, reply_to = f"{prefix}hooks", f"{prefix}replies"
    entries = await delivered(redis, stream, "g", 3)
    batcher = ReplyBatcher(redis, "g", ack_delay=0.3, ack_ride_after=0.3)  # no reply for them to ride with
    for entry in entries:  # one pipeline each
        await batcher.send(reply_to, {"e": "reply"}, (stream, entry))
    assert await redis.xlen(reply_to) == 3
    assert await pending_ids(redis, stream, "g") == set(entries)

    async def acked() -> bool:
        return not await pending_ids(redis, stream, "g")

    assert await wait_for(acked, timeout=2)
    assert (batcher.batches, batcher.acks_sent) == (4, 1)  # three replies, then one XACK of all


async def test_acks_owed_long_enough_ride_with_the_next_replies(redis, prefix):
    """Hops one at a time: the first hop's ack goes in the pipeline of the second's reply,
    not in a socket write of its own (its timer, 60 s here, never fires)."""
    stream, reply_to = f"{prefix}hooks", f"{prefix}replies"
    first, second = await delivered(redis, stream, "g", 2)
    batcher = ReplyBatcher(redis, "g", ack_delay=60, ack_ride_after=0)
    await batcher.send(reply_to, {"e": "reply"}, (stream, first))
    assert await pending_ids(redis, stream, "g") == {first, second}  # owed, not sent alone
    await batcher.send(reply_to, {"e": "reply"}, (stream, second))
    assert await pending_ids(redis, stream, "g") == {second}  # the first's ack rode with this reply
    assert (batcher.batches, batcher.acks_sent, batcher.unacked) == (2, 1, 1)
    await batcher.close()
    assert await pending_ids(redis, stream, "g") == set()


async def test_close_sends_the_acks_owed(redis, prefix):
    stream, reply_to = f"{prefix}hooks", f"{prefix}replies"
    (entry,) = await delivered(redis, stream, "g", 1)
    batcher = ReplyBatcher(redis, "g", ack_delay=60)
    await batcher.send(reply_to, {"e": "reply"}, (stream, entry))
    assert await pending_ids(redis, stream, "g") == {entry}
    await batcher.close()
    assert await pending_ids(redis, stream, "g") == set()


async def test_no_hop_is_acked_before_its_reply_is_written(redis, redis_url, prefix):
    keys = Keys(prefix)
    stream, reply_to = keys.hooks("quick"), f"{prefix}test-replies"
    worker = WorkerReplica(GroupHost("quick", [Quick()]), redis_url, prefix=prefix, concurrency=4, replica="q-0")
    await worker.start()
    hops = 150
    hop_of: dict[str, str] = {}
    violations: list[str] = []
    checks = 0

    async def all_acked_each_after_its_reply() -> bool:
        """Reads in this order: an entry acked by the second read had its reply by the third."""
        nonlocal checks
        (info,) = [g for g in await redis.xinfo_groups(stream) if g["name"] == b"quick"]
        last = _id(info["last-delivered-id"].decode())
        still = await pending_ids(redis, stream, "quick")
        replied = {decode(f, HopReply).hop_id for _, f in await redis.xrange(reply_to)}
        acked = [e for e in list(hop_of) if _id(e) <= last and e not in still]
        violations.extend(hop_of[e] for e in acked if hop_of[e] not in replied)
        checks += 1
        return len(acked) == hops

    try:
        checking = asyncio.ensure_future(wait_for(all_acked_each_after_its_reply, timeout=20, every=0.001))
        for n in range(hops):
            hop_of[(await redis.xadd(stream, encode(hop(n, reply_to)))).decode()] = f"hop-{n}"  # type: ignore[arg-type]
            await asyncio.sleep(0.001)  # hops arrive over time, as a request's do
        assert await checking
    finally:
        await worker.stop()
    assert violations == []
    assert checks > 20  # the checks ran while hops were answered and acked


def _id(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)
