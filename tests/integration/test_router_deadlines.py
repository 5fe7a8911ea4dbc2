"""The reply router's hop ids and deadlines: ids unique across routers, each hop's own
deadline kept under the one shared timer, answered hops not kept for their deadline."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from hookbus.bus.connection.retrying import connect
from hookbus.bus.groups.periodic import cancel_and_wait
from hookbus.bus.hops.reply_router import COMPACT_AT, HopTimeout, ReplyRouter
from hookbus.bus.wire.envelopes import HopEvent, HopReply, decode, encode
from tests.waiting import wait_for


def hop(router: ReplyRouter) -> HopEvent:
    return HopEvent(
        hop_id=router.new_hop_id(), completion_id="c", lifecycle="on_message", stage_key="on_message",
        ctx={}, reply_to=router.reply_stream, deadline=time.time() + 30,
    )


@contextlib.asynccontextmanager
async def running_router(redis_url: str, reply_stream: str):  # type: ignore[no-untyped-def]
    router = ReplyRouter(connect(redis_url), connect(redis_url, retries=0), reply_stream)
    await router.start()
    try:
        yield router
    finally:
        await router.stop()


async def test_hop_ids_are_unique_across_routers_and_restarts(redis_url, prefix):
    ids: set[str] = set()
    for _restart in range(2):
        async with running_router(redis_url, f"{prefix}a") as first, running_router(redis_url, f"{prefix}b") as second:
            for _ in range(1000):
                ids.update((first.new_hop_id(), second.new_hop_id()))
    assert len(ids) == 4000


async def answer(redis_url: str, stream: str, skip: frozenset[int] = frozenset()) -> None:
    """A stand-in worker: answers every hop on `stream` but the `skip`-th ones."""
    client = connect(redis_url)
    last, seen = "0-0", 0
    try:
        while True:
            for _stream, entries in await client.xread({stream: last}, block=1000) or ():
                for entry_id, fields in entries:
                    last, event = entry_id, decode(fields, HopEvent)
                    if seen not in skip:
                        reply = HopReply(hop_id=event.hop_id, completion_id=event.completion_id, replica="r")
                        await client.xadd(event.reply_to, encode(reply))  # type: ignore[arg-type]
                    seen += 1
    finally:
        await client.aclose()


async def test_each_hop_times_out_at_its_own_deadline_and_the_others_are_answered(redis_url, prefix):
    hooks = f"{prefix}hooks"
    async with running_router(redis_url, f"{prefix}replies") as router:
        worker = asyncio.create_task(answer(redis_url, hooks, skip=frozenset({0, 1})))
        try:
            started = time.perf_counter()
            slow = asyncio.create_task(router.call(hooks, hop(router), 1.5))  # unanswered, armed first
            await asyncio.sleep(0.05)
            with pytest.raises(HopTimeout):  # unanswered, a sooner deadline than the armed one
                await router.call(hooks, hop(router), 0.3)
            assert 0.3 <= time.perf_counter() - started < 1.0
            answered = await asyncio.gather(*(router.call(hooks, hop(router), 5) for _ in range(3)))
            assert len({r.hop_id for r in answered}) == 3
            with pytest.raises(HopTimeout):
                await slow
            assert 1.5 <= time.perf_counter() - started < 3.0
        finally:
            await cancel_and_wait(worker)


async def test_answered_hops_are_not_kept_until_their_deadline(redis_url, prefix):
    hooks = f"{prefix}hooks"
    async with running_router(redis_url, f"{prefix}replies") as router:
        worker = asyncio.create_task(answer(redis_url, hooks))
        try:
            for _ in range(3 * COMPACT_AT // 50):
                await asyncio.gather(*(router.call(hooks, hop(router), 600) for _ in range(50)))
            assert len(router._deadlines._heap) <= COMPACT_AT + 50
        finally:
            await cancel_and_wait(worker)


async def test_after_the_reply_of_a_hop_sent_on_the_next_read_goes_at_once(redis_url, prefix):
    """That reply leads to no write (its caller waits for the next group's reply), so the
    reader must not offer its next read to ride with one: with a linger of 2 s, the next
    group's reply would wait 2 s in Redis."""
    stream = f"{prefix}replies"
    router = ReplyRouter(connect(redis_url), connect(redis_url, retries=0), stream, linger=2.0)
    await router.start()
    client = connect(redis_url)
    try:
        event = hop(router)
        router.expect(["next"])
        waiting = asyncio.create_task(router.call(f"{prefix}hooks", event, timeout=10))
        await asyncio.sleep(0.05)
        sent_on = HopReply(hop_id=event.hop_id, completion_id="c", replica="r", forwarded="next")
        await client.xadd(stream, encode(sent_on))  # type: ignore[arg-type]
        assert (await waiting).forwarded == "next"
        await asyncio.sleep(0.05)  # the reader reads again meanwhile
        started = time.monotonic()
        await client.xadd(stream, encode(HopReply(hop_id="next", completion_id="c", replica="r")))  # type: ignore[arg-type]
        reply = await router.wait("next", timeout=10)
        elapsed = time.monotonic() - started
    finally:
        await client.aclose()
        await router.stop()
    assert reply.hop_id == "next"
    assert elapsed < 1.0, elapsed


async def _blocked_reads(client) -> int:  # type: ignore[no-untyped-def]
    """Clients blocked in an XREAD right now (CLIENT LIST)."""
    listed = await client.client_list()
    return sum(1 for c in listed if "b" in c.get("flags", "") and c.get("cmd") == "xread")


async def polling_answer(redis_url: str, stream: str) -> None:
    """A stand-in worker that polls instead of blocking, so the router's read is the only
    blocking one."""
    client = connect(redis_url)
    last = "0-0"
    try:
        while True:
            for _stream, entries in await client.xread({stream: last}, count=100) or ():
                for entry_id, fields in entries:
                    last, event = entry_id, decode(fields, HopEvent)
                    reply = HopReply(hop_id=event.hop_id, completion_id=event.completion_id, replica="r")
                    await client.xadd(event.reply_to, encode(reply))  # type: ignore[arg-type]
            await asyncio.sleep(0.002)
    finally:
        await client.aclose()


async def test_a_reader_with_no_hop_waiting_reads_nothing_and_the_next_hop_wakes_it(redis_url, prefix):
    """While no hop waits for a reply (an LLM call between two stages, an idle
    orchestrator), no XREAD of the router's sits blocked in Redis; the next hop's read
    goes with it, so its reply comes at once."""
    hooks = f"{prefix}hooks"
    client = connect(redis_url)
    async with running_router(redis_url, f"{prefix}replies") as router:
        worker = asyncio.create_task(polling_answer(redis_url, hooks))
        try:
            await asyncio.sleep(0.2)
            idle = [await _blocked_reads(client)]
            for _ in range(3):
                started = time.monotonic()
                await router.call(hooks, hop(router), 5)
                assert time.monotonic() - started < 1.0
                await asyncio.sleep(0.1)  # past the linger of a read offered to ride
                idle.append(await _blocked_reads(client))
        finally:
            await cancel_and_wait(worker)
            await client.aclose()
    assert idle == [0, 0, 0, 0]


async def test_a_reply_over_the_hop_limit_fails_its_hop_undecoded_whatever_wrote_it(redis_url, prefix):
    """A worker that ignores HOOKBUS_MAX_HOP_BYTES (here: a raw XADD) cannot make the
    orchestrator decode and keep its reply: the hop fails at once, naming the limit; the
    next reply, under it, is taken as usual and the big one is trimmed away."""
    stream = f"{prefix}replies"
    router = ReplyRouter(connect(redis_url), connect(redis_url, retries=0), stream, max_reply_bytes=64 * 1024)
    await router.start()
    client = connect(redis_url)
    try:
        event = hop(router)
        waiting = asyncio.create_task(router.call(f"{prefix}hooks", event, timeout=30))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        big = HopReply(hop_id=event.hop_id, completion_id="c", replica="r", state={"blob": "x" * 200_000})
        await client.xadd(stream, encode(big))  # type: ignore[arg-type]
        reply = await waiting
        assert time.monotonic() - started < 5
        assert reply.failure is not None and "HOOKBUS_MAX_HOP_BYTES" in reply.failure and reply.state == {}
        assert router.oversized_replies == 1
        small_hop = hop(router)
        answering = asyncio.create_task(router.call(f"{prefix}hooks", small_hop, timeout=30))
        await asyncio.sleep(0.05)
        await client.xadd(stream, encode(HopReply(hop_id=small_hop.hop_id, completion_id="c", replica="r", state={"k": 1})))  # type: ignore[arg-type]
        assert (await answering).state == {"k": 1}
        assert await wait_for(lambda: _trimmed(client, stream), timeout=10)
    finally:
        await client.aclose()
        await router.stop()


async def _trimmed(client, stream: str) -> bool:  # type: ignore[no-untyped-def]
    """Whether the stream holds less than the big reply."""
    entries = await client.xrange(stream)
    return sum(len(v) for _, fields in entries for v in fields.values()) < 64 * 1024
