"""Observers in a worker group, over real Redis: no hop, one entry per request, every stage
in order, the final state on every path, the backlog in `hookbus status`."""

from __future__ import annotations

from itertools import groupby
from typing import Any

import pytest

from hookbus import Agent
from hookbus.bus.connection.retrying import connect
from hookbus.bus.keys import Keys
from hookbus.bus.wire.envelopes import monitor_records
from hookbus.services.cli.monitor import read_status
from hookbus.skills import Context, HookData, HookError, PaymentRequired, Skill, hook, tool
from tests.integration.stack import running_stack
from tests.waiting import wait_for


class Audit(Skill):
    """Watches every stage but the chunks; keeps what it saw."""

    name = "audit"

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def _keep(self, data: HookData, ctx: Context, **facts: Any) -> None:
        ctx.state["audit_seen"] = ctx.state.get("audit_seen", 0) + 1
        self.seen.append({
            "cid": ctx.completion_id, "lifecycle": data.lifecycle, "seen": ctx.state["audit_seen"],
            "stamp": ctx.state.get("stamp"), "attempt": ctx.call.attempt, **facts,
        })

    @hook("on_connection", observe=True)
    async def connection(self, data: HookData, ctx: Context) -> None:
        self._keep(data, ctx)

    @hook("before_toolcall", observe=True)
    async def tool_call(self, data: HookData, ctx: Context) -> None:
        self._keep(data, ctx, call=(data.tool_call or {}).get("function", {}).get("name"))

    @hook("after_toolcall", observe=True)
    async def tool_result(self, data: HookData, ctx: Context) -> None:
        self._keep(data, ctx, result=data.tool_result)

    @hook("on_chunk", observe=True)
    async def chunk(self, data: HookData, ctx: Context) -> None:
        self._keep(data, ctx, content=data.content, full=data.full_content)

    @hook("finalize_connection", observe=True)
    async def finalize(self, data: HookData, ctx: Context) -> None:
        self._keep(data, ctx, error=data.error.code if data.error else None)
        raise RuntimeError("an observer's failure is only recorded")


class Stamp(Skill):
    """In-process blocking hooks and the tool the model calls."""

    name = "stamp"

    @hook("on_connection", 10)
    async def stamp(self, data: HookData, ctx: Context) -> None:
        ctx.state["stamp"] = "s1"

    @hook("before_llm_call", 10)
    async def refuse(self, data: HookData, ctx: Context) -> None:
        if "refuse" in str((data.messages or [{}])[-1].get("content")):
            raise PaymentRequired("no credit")

    @tool
    async def lookup(self, key: str) -> str:
        """Look a key up.

        Args:
            key: the key
        """
        return f"value of {key}"


def of(audit: Audit, cid: str) -> list[dict[str, Any]]:
    return [s for s in audit.seen if s["cid"] == cid]


async def test_group_observers_see_every_stage_in_order_without_a_hop(redis_url, prefix):
    audit = Audit()
    agent = Agent("obs", skills=[Stamp()])
    async with running_stack(redis_url, prefix, agent, {"audit": [audit]}) as (client, services, workers):
        chunks = [c async for c in client.stream('Look it up. [[tool:lookup {"key": "k"}]]')]
        cid = chunks[0].id
        assert await wait_for(lambda: _finalized(audit, cid), timeout=10)
        assert services[0].runtime is not None and services[0].runtime.hops == 0  # nothing waited for
        records = await _records(redis_url, prefix, cid)
    seen = of(audit, cid)
    calls = [s["lifecycle"] for s in seen].index("before_toolcall")
    lifecycles = [s["lifecycle"] for s in seen]
    runs = [lc for lc, _ in groupby(lifecycles)]  # each LLM call streams its chunks (the tool call's too)
    assert runs == [
        "on_connection", "on_chunk", "before_toolcall", "after_toolcall", "on_chunk", "finalize_connection"
    ]
    assert [s["seen"] for s in seen] == list(range(1, len(seen) + 1))  # its own state carried, in order
    assert all(s["stamp"] == "s1" for s in seen)  # the request's state as each stage ended
    assert seen[calls]["call"] == "lookup" and seen[calls + 1]["result"] == "value of k"
    texts = [s for s in seen[calls:] if s["lifecycle"] == "on_chunk"]
    assert "".join(s["content"] or "" for s in texts) == texts[-1]["full"]
    assert texts[-1]["full"] == "The tool lookup returned: value of k"
    assert seen[-1]["error"] is None
    assert workers[0].observer is not None and workers[0].observer.observed == 1  # one entry per request
    observed = [r for r in records if r.kind == "observe"]
    assert {r.lifecycle for r in observed} == set(lifecycles)
    final = next(r for r in observed if r.lifecycle == "finalize_connection")
    assert final.outcome == "failed" and "only recorded" in (final.error or "")
    assert not [r for r in records if r.kind == "hop"]


async def test_a_replica_reads_and_acks_the_requests_that_ended_together_in_one_command_each(redis_url, prefix):
    """The observer stream is read once per LINGER: one after another, requests cost the
    replica far fewer XREADGROUPs than entries, the entries of a read one XACK once the
    last of them ran (never more XACKs than reads), and every request is observed."""
    audit = Audit()
    agent = Agent("obs", skills=[Stamp()])
    async with running_stack(redis_url, prefix, agent, {"audit": [audit]}) as (client, _, workers):
        cids = [(await client.complete(f"hello {n}")).id for n in range(6)]
        observer = workers[0].observer
        assert observer is not None

        async def all_acked() -> bool:
            return observer.observed == 6 and observer.acks > 0 and not observer._unacked

        assert await wait_for(all_acked, timeout=10)
        assert all([await _finalized(audit, cid) for cid in cids])
        assert observer.observed == 6
        assert observer.reads < 6 and observer.acks <= observer.reads, (observer.reads, observer.acks)


async def test_a_finalize_observer_in_a_group_sees_the_error_of_a_refused_request(redis_url, prefix):
    audit = Audit()
    agent = Agent("obs", skills=[Stamp()])
    async with running_stack(redis_url, prefix, agent, {"audit": [audit]}) as (client, _, _):
        with pytest.raises(HookError) as refused:
            await client.complete("please refuse")
        assert refused.value.status_code == 402
        assert await wait_for(lambda: _any_finalized(audit), timeout=10)
    lifecycles = [s["lifecycle"] for s in audit.seen]
    assert lifecycles == ["on_connection", "finalize_connection"]
    assert audit.seen[-1]["error"] == "payment_required"


async def test_status_shows_the_observer_backlog(redis_url, prefix):
    audit = Audit()
    agent = Agent("obs", skills=[Stamp()])
    async with running_stack(redis_url, prefix, agent, {"audit": [audit]}) as (client, _, workers):
        await workers[0].observer.stop_reading()  # type: ignore[union-attr]
        for _ in range(3):
            await client.complete("hello")
        redis = connect(redis_url)
        try:
            status = await read_status(redis, Keys(prefix))
        finally:
            await redis.aclose()
    (group,) = status.groups
    assert group.observe_lag == 3 and group.lag == 0
    assert any("(observer)" in h for h in group.hooks)


class Opaque(Skill):
    """A blocking in-process hook that leaves a value in ctx.state that is not JSON."""

    name = "opaque"

    @hook("on_connection", 10)
    async def keep(self, data: HookData, ctx: Context) -> None:
        ctx.state["handle"] = object()


async def test_a_stage_its_group_observers_cannot_be_sent_fails_no_request(redis_url, prefix):
    audit = Audit()
    agent = Agent("obs", skills=[Opaque()])
    async with running_stack(redis_url, prefix, agent, {"audit": [audit]}) as (client, _, workers):
        completion = await client.complete("[[echo]] still answered")
        assert completion.choices[0].message.content == "still answered"
        assert workers[0].observer is not None and workers[0].observer.observed == 0
    assert audit.seen == []


async def test_in_process_observers_of_a_bus_orchestrator_are_recorded_as_events(redis_url, prefix):
    audit = Audit()
    agent = Agent("obs", skills=[audit])
    async with running_stack(redis_url, prefix, agent) as (client, _, _):
        completion = await client.complete("[[echo]] hi")
        assert await agent.observers_idle(5)
        records = await _records(redis_url, prefix, completion.id)
    observed = {r.lifecycle: r for r in records if r.kind == "observe"}
    assert set(observed) == {"on_connection", "finalize_connection"}
    assert all(r.group is None for r in observed.values())
    assert observed["finalize_connection"].outcome == "failed"  # Audit's finalize raises on purpose


async def _finalized(audit: Audit, cid: str) -> bool:
    return any(s["lifecycle"] == "finalize_connection" for s in of(audit, cid))


async def _any_finalized(audit: Audit) -> bool:
    return any(s["lifecycle"] == "finalize_connection" for s in audit.seen)


async def _records(redis_url: str, prefix: str, cid: str) -> list[Any]:
    redis = connect(redis_url)
    try:
        async def flushed() -> list[Any]:
            found = []
            for _, fields in await redis.xrange(Keys(prefix).events):
                found += [r for r in monitor_records(fields) if r.completion_id == cid and r.kind == "observe"]
            return found if any(r.lifecycle == "finalize_connection" for r in found) else []

        await wait_for(flushed, timeout=5)
        records = []
        for _, fields in await redis.xrange(Keys(prefix).events):
            records += [r for r in monitor_records(fields) if r.completion_id == cid]
        return records
    finally:
        await redis.aclose()
