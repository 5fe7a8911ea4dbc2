"""Streams stay bounded, and nothing that is not acknowledged is ever trimmed away."""

from __future__ import annotations

import asyncio
import uuid

from hookbus import Agent
from hookbus.bus.groups.trim import trim_acked
from hookbus.bus.keys import ORCHESTRATOR_GROUP
from hookbus.bus.store.events import EVENTS_MAXLEN
from hookbus.bus.store.journal import DONE_TTL, Journal
from hookbus.skills import Context, HookData, Skill, hook
from tests.faults.helpers import pending
from tests.integration.stack import running_stack
from tests.waiting import wait_for


async def test_trim_keeps_pending_and_undelivered_entries_of_every_group(redis):
    stream = f"trim-{uuid.uuid4().hex[:8]}"
    ids = [await redis.xadd(stream, {"n": str(n)}) for n in range(8)]
    assert await trim_acked(redis, stream) == (0, "")  # no consumer group: nobody read anything
    await redis.xgroup_create(stream, "fast", id="0")
    await redis.xgroup_create(stream, "slow", id="0")
    await redis.xreadgroup("fast", "a", {stream: ">"}, count=6)
    await redis.xack(stream, "fast", *ids[:2], *ids[3:6])  # ids[2] stays pending in "fast"
    await redis.xreadgroup("slow", "b", {stream: ">"}, count=1)
    await redis.xack(stream, "slow", ids[0])  # "slow" has read only one entry so far

    removed, _ = await trim_acked(redis, stream)
    assert removed == 1 and [e for e, _ in await redis.xrange(stream)] == ids[1:]

    await redis.xreadgroup("slow", "b", {stream: ">"}, count=7)
    await redis.xack(stream, "slow", *ids[1:])
    removed, minid = await trim_acked(redis, stream)
    assert removed == 1 and minid == ids[2].decode()  # "fast" still holds ids[2]
    assert [e for e, _ in await redis.xrange(stream)] == ids[2:]

    await redis.xack(stream, "fast", ids[2])
    await redis.xreadgroup("fast", "a", {stream: ">"}, count=10)  # ids[6], ids[7] now pending
    await trim_acked(redis, stream)
    assert [e for e, _ in await redis.xrange(stream)] == ids[6:]
    await redis.xack(stream, "fast", *ids[6:])
    await trim_acked(redis, stream)
    assert await redis.xlen(stream) == 0


class Hold(Skill):
    name = "hold"

    @hook("on_connection", 10)
    async def wait(self, data: HookData, ctx: Context) -> HookData:
        if "hold" in (data.messages[-1].get("content") or ""):
            await asyncio.sleep(1.0)  # the point: its hop stays pending while the janitors run
        return data


class Shout(Skill):
    name = "shout"

    @hook("on_chunk")
    def shout(self, data: HookData, ctx: Context) -> HookData:
        if data.content:
            data.content = data.content.upper()
        return data


async def test_after_a_run_the_streams_are_bounded_and_a_pending_hop_survives_the_janitor(redis_url, prefix):
    groups = {"hold": [Hold()], "shout": [Shout()]}
    async with running_stack(redis_url, prefix, Agent("t"), groups) as (client, services, workers):
        redis, keys = client.redis, client.keys
        hold, shout = (next(w for w in workers if w.group == g).pinned_streams[0] for g in ("hold", "shout"))
        texts = await asyncio.gather(*(client.complete(f"[[words:12]] n{n}") for n in range(25)))
        assert all(t.choices[0].message.content for t in texts)

        async def hops_acked() -> bool:  # a worker's acks follow its replies
            return await pending(redis, hold, "hold") + await pending(redis, shout, "shout") == 0

        assert await wait_for(hops_acked, timeout=5)

        # a request in flight: its hop is pending in "hold" while every janitor runs
        held = asyncio.create_task(client.complete("[[echo]] hold on"))
        assert await wait_for(lambda: pending(redis, hold, "hold"), timeout=5, every=0.01)
        [entry] = await redis.xpending_range(hold, "hold", "-", "+", 10)
        for worker in workers:
            await worker.janitor_once()
        await services[0].recovery.janitor_once()
        assert [e for e, _ in await redis.xrange(hold)] == [entry["message_id"]]
        assert await redis.xlen(keys.requests) == 1  # the held request, not yet acked
        assert (await held).choices[0].message.content == "hold on"
        assert await wait_for(hops_acked, timeout=5)
        for worker in workers:
            await worker.janitor_once()
        await services[0].recovery.janitor_once()
        assert await redis.xlen(hold) == 0
        assert await redis.xlen(shout) == 0
        assert await redis.xlen(keys.requests) == 0
        assert await pending(redis, keys.requests, ORCHESTRATOR_GROUP) == 0
        # the reply stream is trimmed by its reader, response streams are gone (read, or
        # expiring), journals expire soon after the request ended, events are capped
        assert await redis.xlen(services[0].runtime.router.reply_stream) <= 300

        async def answers_gone() -> bool:  # the client deletes those it read within 0.2 s
            return not await redis.keys(f"{keys.prefix}responses:*")

        assert await wait_for(answers_gone, timeout=5)
        journals = await redis.keys(f"{keys.prefix}journal:*")
        assert len(journals) == 26
        assert all(0 < ttl <= DONE_TTL for ttl in [await redis.ttl(j) for j in journals])
        assert (await Journal(redis, keys).read(journals[0].decode().split("journal:")[1]))["done"] == "1"
        assert EVENTS_MAXLEN <= 100_000
