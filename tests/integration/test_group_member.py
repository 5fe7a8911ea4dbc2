"""The consumer-group member the orchestrator and every worker replica share: over real
Redis, it takes over what a dead consumer left pending, and leaves alone what a live one
holds; on a liveness thread, its heartbeat and leases go on while the event loop is held."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aredis

from hookbus.bus.groups.claims import Claimed, OrphanRules
from hookbus.bus.groups.member import GroupMember, OnThread
from tests.waiting import wait_for

CLAIM_IDLE = 0.3


async def test_a_member_takes_over_a_dead_consumers_entry_and_not_a_live_ones(redis_url, prefix):
    client = aredis.Redis.from_url(redis_url)
    stream, beats = f"{prefix}work", f"{prefix}beats"
    await client.xgroup_create(stream, "g", id="0", mkstream=True)
    dead_id = await client.xadd(stream, {"n": "1"})
    await client.xreadgroup("g", "dead", {stream: ">"}, count=1)  # delivered, never acked
    live_id = await client.xadd(stream, {"n": "2"})
    await client.xreadgroup("g", "alive", {stream: ">"}, count=1)
    taken: list[Claimed] = []

    async def keep_alive_beating() -> None:
        await client.zadd(beats, {"me": time.time(), "alive": time.time()})

    async def take_over(entry: Claimed) -> None:
        taken.append(entry)
        await client.xack(stream, "g", entry.entry_id)

    async def nothing() -> None:
        return None

    member = GroupMember(
        OrphanRules(stream, "g", "me", beats, CLAIM_IDLE),
        client=lambda: client, concurrency=4, trim_every=60.0, busy=lambda: set(),
        beat=keep_alive_beating, renew=nothing, tidy=nothing, take_over=take_over,
    )
    try:
        member.start()
        assert await wait_for(lambda: _value(taken), timeout=10)
        await member.stop()
        await member.wait_taken(2)
    finally:
        await member.stop()
        pending = await client.xpending_range(stream, "g", min="-", max="+", count=10)
        await client.aclose()
    assert [(e.entry_id, e.previous_owner, e.attempt, e.fields) for e in taken] == [
        (dead_id.decode(), "dead", 2, {b"n": b"1"})
    ]
    assert [(p["message_id"], p["consumer"]) for p in pending] == [(live_id, b"alive")]
    assert member.claimed == 1


async def _value(items: list[Claimed]) -> list[Claimed]:
    return items


async def test_on_a_thread_the_heartbeat_and_leases_go_on_while_the_event_loop_is_held(redis_url, prefix):
    client = aredis.Redis.from_url(redis_url)
    stream, beats = f"{prefix}work", f"{prefix}beats"
    await client.xgroup_create(stream, "g", id="0", mkstream=True)
    renewals: list[float] = []

    def beat(sync) -> None:
        sync.zadd(beats, {"me": time.time()})

    def renew(sync) -> None:
        renewals.append(time.time())

    async def nothing() -> None:
        return None

    member = GroupMember(
        OrphanRules(stream, "g", "me", beats, CLAIM_IDLE),
        client=lambda: client, concurrency=4, trim_every=60.0, busy=lambda: set(),
        tidy=nothing, take_over=lambda entry: nothing(),
        on_thread=OnThread(redis_url, "test-liveness", beat, renew),
    )
    try:
        member.start()
        held_from = time.time()
        time.sleep(1.0)  # noqa: ASYNC251 - the point: the event loop is held, as a large request can
        score = await client.zscore(beats, "me")
        assert score is not None and score > held_from + 0.5
        assert len([t for t in renewals if t > held_from + 0.5]) >= 2  # every claim_idle / 3 = 0.1 s
    finally:
        await member.stop()
    stopped = len(renewals)
    await asyncio.sleep(0.5)  # a "nothing more happens" check: stopped, the thread renews no more
    await client.aclose()
    assert len(renewals) == stopped
