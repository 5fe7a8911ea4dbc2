"""The failure rules are one set, wherever a hook runs: the same skills in the agent's own
process and in a worker group (over real Redis) give the same answers, the same undone
state, the same blocked tool call, the same 500, the same refused return of another
lifecycle's data, and the same recorded on_compaction failure."""

from __future__ import annotations

import time

import pytest

from hookbus import Agent, CompactionPolicy, HookError
from hookbus.services.cli.monitor import recent_events
from hookbus.skills import Context, HookData, Lifecycle, Skill, hook, tool
from tests.integration.stack import running_stack
from tests.waiting import wait_for

TOOL_PROMPT = '[[tool:lookup {"key": "a"}]] look it up'


class Rules(Skill):
    """Fails in each way a hook can; what the chain saw after each failure goes to `seen`."""

    name = "rules"
    seen: list[dict[str, object]] = []

    @hook("on_connection", 10)
    async def half_done(self, data: HookData, ctx: Context) -> HookData:
        ctx.state["half"] = True
        data.messages = [{"role": "user", "content": "rewritten by a hook that then failed"}]
        raise RuntimeError("broke halfway")

    @hook("on_connection", 20)
    async def after_failure(self, data: HookData, ctx: Context) -> None:
        ctx.state["after"] = {"half": "half" in ctx.state, "text": data.messages[-1]["content"]}

    @hook("before_toolcall", 10)
    async def wrong_type(self, data: HookData, ctx: Context) -> object:
        ctx.state["tool_half"] = True
        return {"not": "HookData"}

    @hook("on_message", 10, critical=True, scope="strict")
    async def strict(self, data: HookData, ctx: Context) -> object:
        return "not HookData either"

    @hook("finalize_connection")
    async def record(self, data: HookData, ctx: Context) -> None:
        Rules.seen.append({
            "after": ctx.state.get("after"),
            "tool_half": "tool_half" in ctx.state,
            "error": None if data.error is None else (data.error.status_code, data.error.code),
        })


class Lookup(Skill):
    name = "lookup"

    @tool
    def lookup(self, key: str) -> str:
        """Look a key up."""
        return f"value of {key}"


class BrokenListener(Skill):
    name = "broken-listener"

    async def on_compaction(self, outcome, ctx) -> None:
        raise RuntimeError("listener down")


async def _observe(agent_or_client, strict_call) -> dict[str, object]:
    Rules.seen = []
    tool_answer = await agent_or_client(TOOL_PROMPT, None)
    with pytest.raises(HookError) as failed:
        await strict_call()
    return {
        "tool_answer": tool_answer.choices[0].message.content,
        "strict": (type(failed.value).__name__, failed.value.status_code, failed.value.code),
        "seen": list(Rules.seen),
    }


async def test_in_process_and_remote_hooks_fail_by_the_same_rules(redis_url, prefix):
    local = Agent("rules-local", skills=[Rules(), Lookup()])
    in_process = await _observe(
        lambda text, auth: local.run(text, auth=auth),
        lambda: local.run("hi", auth={"scopes": ["strict"]}),
    )
    async with running_stack(redis_url, prefix, Agent("rules-remote", skills=[Lookup()]), {"rules": [Rules()]}) as (
        client, _, _,
    ):
        remote = await _observe(
            lambda text, auth: client.complete(text, auth=auth),
            lambda: client.complete("hi", auth={"scopes": ["strict"]}),
        )
    assert in_process == remote
    assert "Tool call blocked by rules.wrong_type: returned dict, expected HookData or None" in str(
        in_process["tool_answer"]
    )
    assert in_process["strict"] == ("HookError", 500, "hook_failed")
    # the failed hook's message rewrite and its ctx.state write were both undone
    assert in_process["seen"] == [
        {"after": {"half": False, "text": TOOL_PROMPT}, "tool_half": False, "error": None},
        {"after": {"half": False, "text": "hi"}, "tool_half": False, "error": (500, "hook_failed")},
    ]


class Hijack(Skill):
    """Returns another lifecycle's data from on_connection (the conversation of on_message)."""

    name = "hijack"

    @hook("on_connection", 5)
    def confused(self, data: HookData, ctx: Context) -> HookData:
        return HookData(lifecycle="on_message", messages=[{"role": "user", "content": "[[echo]] hijacked"}])


class RemoteHijack(Hijack):
    name = "remote-hijack"


async def test_another_lifecycles_data_is_refused_alike_in_process_and_in_a_group(redis_url, prefix):
    agent = Agent("hijacked", skills=[Hijack()])
    async with running_stack(redis_url, prefix, agent, {"hijackers": [RemoteHijack()]}) as (client, _, _):
        completion = await client.complete("[[echo]] untouched", completion_id="chatcmpl-hijack")

        async def records():
            found = [
                e for e in await recent_events(client.redis, client.keys)
                if e.kind == "stage" and e.lifecycle == "on_connection" and e.completion_id == "chatcmpl-hijack"
            ]
            return found if len(found) >= 2 else None

        found = await wait_for(records, timeout=5)
    assert completion.choices[0].message.content == "untouched"
    refused = "returned the HookData of on_message, expected that of on_connection"
    assert {e.group: (e.hooks, e.outcome, e.error) for e in found} == {
        None: (["hijack.confused"], "failed", refused),
        "hijackers": (["remote-hijack.confused"], "failed", refused),
    }


async def test_an_on_compaction_failure_is_recorded_alike_in_process_and_in_a_group(redis_url, prefix):
    messages = [{"role": "system", "content": "Be brief."}] + [
        {"role": role, "content": f"{role} turn {n}: " + "word " * 80}
        for n in range(3) for role in ("user", "assistant")
    ]
    agent = Agent("listeners", skills=[BrokenListener()], compaction_policy=CompactionPolicy(window=1000))
    async with running_stack(redis_url, prefix, agent, {"listeners": [BrokenListener()]}) as (client, _, _):
        outcome = await agent.compact(messages)

        async def records():
            found = [
                e for e in await recent_events(client.redis, client.keys)
                if e.kind == "stage" and e.lifecycle == Lifecycle.ON_COMPACTION
                and e.completion_id == f"compaction-{outcome.id}"
            ]
            return found if len(found) >= 2 else None

        found = await wait_for(records, timeout=5)
    assert outcome.stage == "summarized"
    by_group = {e.group: (e.hooks, e.outcome, e.error) for e in found}
    failure = (["broken-listener.on_compaction"], "failed", "RuntimeError: listener down")
    assert by_group == {None: failure, "listeners": failure}


class Unencodable(Skill):
    """Leaves a value in ctx.state that JSON cannot carry back to the orchestrator."""

    name = "unencodable"
    calls = 0
    finalized: list[object] = []

    @hook("before_llm_call", 10)
    async def keep_an_object(self, data: HookData, ctx: Context) -> None:
        Unencodable.calls += 1
        ctx.state["handle"] = object()

    @hook("finalize_connection")
    async def cleanup(self, data: HookData, ctx: Context) -> None:
        Unencodable.finalized.append(data.error)


async def test_a_reply_that_cannot_be_encoded_fails_its_hop_at_once_and_the_hook_runs_once(redis_url, prefix):
    """Unanswered, the hop was claimed and run again every claim_idle until dead-lettered
    (4 runs, 18 s with claim_idle=5): now the worker answers it as failed at once."""
    Unencodable.calls, Unencodable.finalized = 0, []
    agent = Agent("unencodable", skills=[])
    groups = {"unencodable": [Unencodable()]}
    async with running_stack(redis_url, prefix, agent, groups, claim_idle=30) as (client, _, workers):
        started = time.monotonic()
        answer = await client.complete("hi")
        elapsed = time.monotonic() - started

        async def failed_hop():
            found = [
                e for e in await recent_events(client.redis, client.keys)
                if e.kind == "hop" and e.completion_id == answer.id and e.lifecycle == "before_llm_call"
            ]
            return found or None

        hops = await wait_for(failed_hop, timeout=5)
        dead = await client.redis.xlen(client.keys.dead_letter)
    assert answer.choices[0].message.content == "Offline model reply to: hi"
    assert elapsed < 5, elapsed
    assert Unencodable.calls == 1
    assert Unencodable.finalized == [None]  # cleanup ran, and the request did not fail
    assert [(e.outcome, "not JSON" in (e.error or "")) for e in hops] == [("hop_failed", True)]
    assert dead == 0 and workers[0].dead_lettered == 0
