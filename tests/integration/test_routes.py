"""A stage whose segments live in several worker groups is sent on from group to group
(hookbus.bus.hops.send_on): the orchestrator sends the first hop, each worker sends the next,
and every group still replies. Over real Redis, with real worker replicas: the chain
gives what hop-by-hop gives, an abort or a block stops the route where the orchestrator
would stop, finalize_connection goes on past an abort, a group whose hook times out
costs only its own hooks, and a next hop Redis refuses is answered as failed."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from hookbus import Agent, HookError
from hookbus.bus.wire.envelopes import HookRef, HopEvent, HopReply, RouteStep, decode, encode_hop
from hookbus.services.cli.monitor import recent_events
from hookbus.services.observability.tracing import configure_tracing, shutdown_tracing
from hookbus.skills import Context, HookData, Skill, hook
from tests.integration.stack import running_stack
from tests.waiting import wait_for


class First(Skill):
    """Group one: tags the message; refuses a request that says `refuse`; its
    finalize hook raises (finalize goes on past it)."""

    name = "first"
    finalized: list[str] = []

    @hook("on_connection", 10)
    async def tag(self, data: HookData, ctx: Context) -> HookData:
        last = data.messages[-1]
        if "refuse" in last["content"]:
            raise HookError(402, "payment_required", "no credit left")
        ctx.state["first"] = "tagged"
        data.messages[-1] = {**last, "content": f"{last['content']} +first"}
        return data

    @hook("before_llm_call", 10, timeout=0.4)
    async def late(self, data: HookData, ctx: Context) -> None:
        if "late" in data.messages[-1]["content"]:
            await asyncio.sleep(1)  # the point: past this hook's timeout, so past its hop's deadline

    @hook("finalize_connection", 10)
    async def close(self, data: HookData, ctx: Context) -> None:
        First.finalized.append(ctx.completion_id)
        raise HookError(500, "cleanup_failed", "the first group's cleanup broke")


class Second(Skill):
    """Group two: sees what group one left; hangs past its timeout on `hang`."""

    name = "second"
    seen: list[object] = []
    llm_calls: list[str] = []
    finalized: list[object] = []

    @hook("on_connection", 20, timeout=0.5)
    async def look(self, data: HookData, ctx: Context) -> HookData:
        last = data.messages[-1]
        Second.seen.append(ctx.state.get("first"))
        if "hang" in last["content"]:
            await asyncio.sleep(3)  # the point: past this hook's timeout
        data.messages[-1] = {**last, "content": f"{last['content']} +second"}
        return data

    @hook("before_llm_call", 20)
    async def before(self, data: HookData, ctx: Context) -> None:
        Second.llm_calls.append(ctx.completion_id)

    @hook("finalize_connection", 20)
    async def close(self, data: HookData, ctx: Context) -> None:
        Second.finalized.append(None if data.error is None else data.error.code)


def _reset() -> None:
    First.finalized, Second.seen, Second.llm_calls, Second.finalized = [], [], [], []


async def _stage_records(client, completion_id: str, lifecycle: str, count: int):
    async def found():
        records = [
            e for e in await recent_events(client.redis, client.keys)
            if e.kind == "stage" and e.completion_id == completion_id and e.lifecycle == lifecycle
        ]
        return records if len(records) >= count else None

    return await wait_for(found, timeout=5)


async def test_the_first_group_sends_the_stage_on_and_every_segment_is_recorded(redis_url, prefix):
    _reset()
    groups = {"one": [First()], "two": [Second()]}
    async with running_stack(redis_url, prefix, Agent("routes"), groups) as (client, services, _):
        runtime = services[0].runtime
        answer = await client.complete("[[echo]] hello")
        records = await _stage_records(client, answer.id, "on_connection", 2)
    assert answer.choices[0].message.content == "hello +first +second"
    assert Second.seen == ["tagged"]  # group two ran on group one's data and state
    # on_connection, before_llm_call, finalize_connection: two groups each, the second
    # group's hop sent on by group one's worker
    assert runtime.forwarded == 3
    assert [(r.group, r.outcome) for r in records] == [("one", "ok"), ("two", "ok")]
    # group one's finalize hook raised: finalize went on to group two all the same
    assert First.finalized == [answer.id] and Second.finalized == [None]


async def test_with_send_on_off_every_hop_is_the_orchestrators_and_the_answer_the_same(redis_url, prefix, monkeypatch):
    _reset()
    monkeypatch.setenv("HOOKBUS_SEND_ON", "false")
    groups = {"one": [First()], "two": [Second()]}
    async with running_stack(redis_url, prefix, Agent("routes"), groups) as (client, services, _):
        answer = await client.complete("[[echo]] hello")
    assert answer.choices[0].message.content == "hello +first +second"
    assert Second.seen == ["tagged"] and Second.finalized == [None]
    runtime = services[0].runtime
    assert (runtime.send_on, runtime.forwarded, runtime.hops) == (False, 0, 6)


async def test_while_tracing_every_hop_is_the_orchestrators(redis_url, prefix, monkeypatch):
    """A hop sent on would have no span of the orchestrator's: while tracing, none is."""
    _reset()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    assert configure_tracing("orchestrator", "orch-0")
    try:
        groups = {"one": [First()], "two": [Second()]}
        async with running_stack(redis_url, prefix, Agent("routes"), groups) as (client, services, _):
            answer = await client.complete("[[echo]] traced")
    finally:
        shutdown_tracing()
    assert answer.choices[0].message.content == "traced +first +second"
    assert (services[0].runtime.forwarded, services[0].runtime.hops) == (0, 6)


async def test_an_abort_ends_the_route_and_finalize_still_reaches_every_group(redis_url, prefix):
    _reset()
    groups = {"one": [First()], "two": [Second()]}
    async with running_stack(redis_url, prefix, Agent("routes"), groups) as (client, services, _):
        runtime = services[0].runtime
        with pytest.raises(HookError) as refused:
            await client.complete("[[echo]] refuse me")
        async def finalized():
            return Second.finalized or None

        await wait_for(finalized, timeout=5)
    assert (refused.value.status_code, refused.value.code) == (402, "payment_required")
    assert Second.seen == []  # the abort stopped the stage in group one: nothing sent on
    # finalize_connection went on past group one's HookError, to group two, sent on
    assert len(First.finalized) == 1 and Second.finalized == ["payment_required"]
    assert runtime.forwarded == 1


async def test_a_group_that_times_out_costs_only_its_own_hooks(redis_url, prefix):
    _reset()
    groups = {"one": [First()], "two": [Second()]}
    async with running_stack(redis_url, prefix, Agent("routes"), groups) as (client, services, _):
        started = time.monotonic()
        answer = await client.complete("[[echo]] hang on")
        elapsed = time.monotonic() - started
        records = await _stage_records(client, answer.id, "on_connection", 2)
    # group one's change stayed; group two's hook timed out and its change is not there
    assert answer.choices[0].message.content == "hang on +first"
    assert [(r.group, r.outcome) for r in records] == [("one", "ok"), ("two", "timeout")]
    assert services[0].runtime.forwarded == 3  # the hop that timed out was one sent on
    assert elapsed < 3, elapsed


async def test_a_worker_past_its_deadline_leaves_the_next_hop_to_the_orchestrator(redis_url, prefix):
    """Group one's hook times out, so its worker answers after its hop's deadline: it does
    not send the stage on (the orchestrator may have given up on it); the orchestrator
    sends group two's hop itself, and group two runs once."""
    _reset()
    groups = {"one": [First()], "two": [Second()]}
    async with running_stack(redis_url, prefix, Agent("routes"), groups) as (client, services, _):
        answer = await client.complete("[[echo]] late")
        records = await _stage_records(client, answer.id, "before_llm_call", 2)
    assert answer.choices[0].message.content == "late +first +second"
    assert [(r.group, r.outcome) for r in records] == [("one", "timeout"), ("two", "ok")]
    assert Second.llm_calls == [answer.id]
    assert services[0].runtime.forwarded == 2  # on_connection and finalize_connection, not this one


class Looker(Skill):
    name = "looker"

    @hook("on_connection", 10)
    async def look(self, data: HookData, ctx: Context) -> None:
        ctx.state["looked"] = True


async def test_a_next_hop_redis_refuses_is_answered_as_failed_in_its_place(redis_url, prefix):
    """The worker told the orchestrator it sent the stage on; Redis refused that hop (its
    stream is a key of another type): the orchestrator must not wait for it in vain."""
    async with running_stack(redis_url, prefix, Agent("routes"), {"lookers": [Looker()]}) as (client, _, _):
        redis = client.redis
        wrong = f"{prefix}not-a-stream"
        replies = f"{prefix}test-replies"
        await redis.set(wrong, "a string")
        event = HopEvent(
            hop_id="h1", completion_id="chatcmpl-refused", lifecycle="on_connection", stage_key="on_connection",
            hooks=[HookRef(skill="looker", method="look")], ctx={}, reply_to=replies,
            deadline=time.time() + 5,
            route=[RouteStep(group="elsewhere", stream=wrong, hop_id="h2", hooks=[HookRef(skill="x", method="y")], timeout=5)],
        )
        data = HookData(lifecycle="on_connection", messages=[{"role": "user", "content": "hi"}])
        await redis.xadd(
            client.keys.hooks_for("lookers", "chatcmpl-refused"),
            encode_hop(event, data.model_dump_json().encode(), Context().model_dump_json().encode()),
        )

        async def two_replies():
            entries = await redis.xrange(replies)
            return entries if len(entries) >= 2 else None

        entries = await wait_for(two_replies, timeout=5)
    first, second = (decode(fields, HopReply) for _, fields in entries)
    assert (first.hop_id, first.forwarded, first.failure, first.state) == ("h1", "h2", None, {"looked": True})
    assert second.hop_id == "h2" and "could not be sent on" in (second.failure or "")
    assert "WRONGTYPE" in (second.failure or "")
    assert json.loads(entries[0][1][b"e"])["forwarded"] == "h2"
