"""on_compaction hooks hosted in a worker group, in both forms (`@hook("on_compaction")` and
the `on_compaction(outcome, ctx)` method): one hop per compaction, over real Redis."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import redis.asyncio as aredis

from hookbus import Agent, Compaction, CompactionPolicy
from hookbus.bus.groups.registry import GroupAnnouncement
from hookbus.bus.wire.envelopes import HookRef, HopEvent
from hookbus.services.worker.host import GroupHost
from hookbus.skills import Context, HookData, Lifecycle, Skill, hook, tool
from hookbus.skills.builtin import MemorySkill
from tests.conversations import conversation
from tests.integration.stack import running_stack


class Blobs(Skill):
    name = "blobs"

    @tool
    def fetch(self, n: int) -> str:
        """Fetch blob n."""
        return f"blob {n}: " + " ".join(f"item{i}" for i in range(400))


class Counter(Skill):
    """Records (compaction id, stage, completion id or None) per call; lives in the worker."""

    def __init__(self, name: str = "counter") -> None:
        self.name = name  # type: ignore[misc]
        self.calls: list[tuple[str, str, str | None]] = []

    async def on_compaction(self, outcome: Compaction, ctx: Context | None) -> None:
        assert isinstance(outcome, Compaction)
        self.calls.append((outcome.id, outcome.stage, ctx.completion_id if ctx else None))
        if ctx is not None:
            ctx.state["seen_by_counter"] = ctx.state.get("seen_by_counter", 0) + 1


class Noted(Skill):
    """The decorated form: a hook on on_compaction like on any other point, (data, ctx) in."""

    def __init__(self, name: str = "noted") -> None:
        self.name = name  # type: ignore[misc]
        self.calls: list[tuple[str, bool | None, str]] = []

    @hook("on_compaction", 60)  # after the method forms (50): the group's hooks stay one hop
    async def note(self, data: HookData, ctx: Context) -> None:
        assert data.lifecycle == Lifecycle.ON_COMPACTION and data.compaction is not None
        self.calls.append((data.compaction.id, data.between_turns, ctx.completion_id))


class Broken(Skill):
    name = "broken"

    def on_compaction(self, outcome: Compaction, ctx: Context | None) -> None:
        raise RuntimeError("listener down")


async def episodes(redis_url: str, key: str) -> list[dict[str, Any]]:
    client = aredis.Redis.from_url(redis_url)
    try:
        return [json.loads(m) for m in await client.zrange(key, 0, -1)]
    finally:
        await client.aclose()


async def test_in_run_compactions_reach_the_worker_group_once_each(redis_url, prefix) -> None:
    local = Counter("local-counter")
    agent = Agent("bus", model="offline-small", skills=[Blobs(), local], max_tool_rounds=30)
    remote, noted = Counter(), Noted()
    memory = MemorySkill(redis_url=redis_url, prefix=prefix)
    groups = {"mem": [memory, remote, Broken(), noted]}
    async with running_stack(redis_url, prefix, agent, groups) as (client, services, workers):
        result = await client.complete("[[loop:fetch]] read every blob", auth={"peer_user_id": "zoe"})
        announced = services[0].runtime.registry.groups["mem"]
        hops = services[0].runtime.hops

    assert result.choices[0].message.content == "Final answer after 30 tool calls."
    assert [(h.key, h.lifecycle) for h in announced.hooks] == [
        ("memory.on_compaction", "on_compaction"), ("counter.on_compaction", "on_compaction"),
        ("broken.on_compaction", "on_compaction"), ("noted.note", "on_compaction"),
    ]
    assert local.calls, "the loop should have needed compaction"
    # every compaction reached the worker exactly once, in order, with the request's ctx
    assert remote.calls == [(cid, stage, result.id) for cid, stage, _ in local.calls]
    assert noted.calls == [(cid, False, result.id) for cid, _, _ in local.calls]
    assert all(stage == "cleared" for _, stage, _ in remote.calls)
    assert hops == len(local.calls)  # one on_compaction hop per compaction (tools are local)
    stored = await episodes(redis_url, f"{prefix}memory:zoe")
    assert sorted(e["id"] for e in stored) == sorted(cid for cid, _, _ in local.calls)
    assert {e["completion_id"] for e in stored} == {result.id}
    assert workers[0].processed == len(local.calls)


async def test_a_compaction_between_turns_reaches_the_group_with_no_ctx(redis_url, prefix) -> None:
    local = Noted("local-noted")
    agent = Agent("bus", skills=[local], compaction_policy=CompactionPolicy(window=1000))
    remote, noted = Counter(), Noted()
    memory = MemorySkill(redis_url=redis_url, prefix=prefix, owner="ops")
    async with running_stack(redis_url, prefix, agent, {"mem": [remote, memory, noted]}):
        messages = conversation(3)
        outcome = await agent.compact(messages, focus="the budget")
        nothing = await agent.compact_if_needed(outcome.messages, 10)

    assert outcome.stage == "summarized" and nothing.stage == "none"
    assert remote.calls == [(outcome.id, "summarized", None)]
    # the decorated form gets a context of no request, named after the compaction
    assert local.calls == noted.calls == [(outcome.id, True, f"compaction-{outcome.id}")]
    stored = await episodes(redis_url, f"{prefix}memory:ops")
    assert [(e["id"], e["focus"], e["completion_id"]) for e in stored] == [
        (outcome.id, "the budget", None)
    ]


async def test_a_stack_without_compaction_listeners_sends_no_hop(redis_url, prefix) -> None:
    agent = Agent("bus", compaction_policy=CompactionPolicy(window=1000))
    async with running_stack(redis_url, prefix, agent, {"tools": [Blobs()]}) as (_, services, _):
        assert services[0].runtime.registry.groups["tools"].hooks == []
        outcome = await agent.compact(conversation(3))
        assert outcome.stage == "summarized" and services[0].runtime.hops == 0


# --------------------------------------------------------------- the worker side, directly


def hop(hooks: list[str], outcome: Compaction, ctx: dict[str, Any], between_turns: bool) -> HopEvent:
    data = HookData(lifecycle="on_compaction", compaction=outcome, between_turns=between_turns)
    return HopEvent(
        hop_id=uuid.uuid4().hex,
        completion_id="chatcmpl-x",
        lifecycle=Lifecycle.ON_COMPACTION,
        stage_key=f"on_compaction:{outcome.id}",
        hooks=[HookRef(skill=key.split(".")[0], method=key.split(".")[1]) for key in hooks],
        data=data.model_dump(mode="json"),
        ctx=ctx,
        reply_to="nowhere",
        deadline=time.time() + 5,
    )


async def test_the_worker_runs_on_compaction_hooks_by_the_runners_rules() -> None:
    counter, noted = Counter(), Noted()
    host = GroupHost("g", [Broken(), counter, Blobs(), noted])
    keys = ["broken.on_compaction", "counter.on_compaction", "noted.note"]
    assert [h.key for h in host.announcement().hooks] == keys
    outcome = await Agent("a", compaction_policy=CompactionPolicy(window=1000)).compact(conversation(3))

    ctx = Context.model_validate({"metadata": {"completion_id": "chatcmpl-x"}, "state": {"k": 1}})
    reply = await host.answer(hop(keys, outcome, ctx.model_dump(mode="json"), False), 1, "r1")
    assert reply.failure is None and reply.abort is None
    assert [(o.hook, o.outcome) for o in reply.outcomes] == [
        ("broken.on_compaction", "failed"), ("counter.on_compaction", "ok"), ("noted.note", "ok"),
    ]
    assert reply.outcomes[0].error == "RuntimeError: listener down"
    assert reply.state == {"k": 1, "seen_by_counter": 1}
    assert counter.calls == [(outcome.id, "summarized", "chatcmpl-x")]
    assert noted.calls == [(outcome.id, False, "chatcmpl-x")]

    between = await host.answer(hop(["counter.on_compaction"], outcome, {}, True), 1, "r1")
    assert between.failure is None and counter.calls[-1] == (outcome.id, "summarized", None)

    unknown = await host.answer(hop(["blobs.on_compaction"], outcome, {}, True), 1, "r1")
    assert unknown.failure and "no hook 'blobs.on_compaction'" in unknown.failure


def test_an_announcement_of_an_older_release_still_reads() -> None:
    """Older releases listed on_compaction skills in a field of their own, now ignored."""
    old = GroupAnnouncement.model_validate_json('{"group": "g", "hooks": [], "tools": [], "compaction": ["x"]}')
    assert old.group == "g" and old.hooks == []
