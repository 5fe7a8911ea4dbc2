"""In-process observers (`@hook(..., observe=True)`): what they see, when, and what they
cannot do. The LLM is the built-in offline model over real HTTP."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from hookbus import Agent
from hookbus.skills import (
    Context,
    HookData,
    HookError,
    OrchestratorLost,
    PaymentRequired,
    Skill,
    hook,
    tool,
)


class Watcher(Skill):
    """Observes every stage; records (lifecycle, stage time, a fact of the data, state)."""

    name = "watcher"

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def _keep(self, data: HookData, ctx: Context, **facts: Any) -> HookData:
        ctx.state["watcher_calls"] = ctx.state.get("watcher_calls", 0) + 1
        self.seen.append((data.lifecycle, {"state": dict(ctx.state), "ended": ctx.call.stage_ended, **facts}))
        data.set_internal(messages=[{"role": "user", "content": "an observer's change"}])
        return data

    @hook("on_connection", observe=True)
    def connection(self, data: HookData, ctx: Context) -> HookData:
        return self._keep(data, ctx, messages=len(data.messages or []))

    @hook("before_llm_call", observe=True)
    def before(self, data: HookData, ctx: Context) -> HookData:
        return self._keep(data, ctx, last=(data.messages or [{}])[-1].get("content"))

    @hook("on_chunk", observe=True)
    def chunk(self, data: HookData, ctx: Context) -> HookData:
        return self._keep(data, ctx, content=data.content, full=data.full_content)

    @hook("after_toolcall", observe=True)
    def after_tool(self, data: HookData, ctx: Context) -> HookData:
        return self._keep(data, ctx, result=data.tool_result)

    @hook("finalize_connection", observe=True)
    def finalize(self, data: HookData, ctx: Context) -> HookData:
        return self._keep(data, ctx, error=data.error.code if data.error else None)


class Stamper(Skill):
    """A blocking hook that writes ctx.state and changes the tool result."""

    name = "stamper"

    @hook("on_connection", 10)
    def stamp(self, data: HookData, ctx: Context) -> None:
        ctx.state["stamp"] = "blocking"

    @hook("after_toolcall", 10)
    def upper(self, data: HookData, ctx: Context) -> HookData:
        data.tool_result = (data.tool_result or "").upper()
        return data

    @tool
    def lookup(self, key: str) -> str:
        """Look a key up.

        Args:
            key: the key
        """
        return f"value of {key}"


async def test_observers_see_each_stage_as_it_ended_in_order_and_change_nothing() -> None:
    watcher = Watcher()
    agent = Agent("t", skills=[Stamper(), watcher])
    result = await agent.run('Look it up. [[tool:lookup {"key": "k"}]]')
    assert await agent.observers_idle(5)
    lifecycles = [lc for lc, _ in watcher.seen]
    assert lifecycles == [
        "on_connection", "before_llm_call", "after_toolcall", "before_llm_call", "finalize_connection"
    ]
    facts = [f for _, f in watcher.seen]
    assert facts[0]["state"]["stamp"] == "blocking"  # the blocking hook's state, as the stage ended
    assert facts[2]["result"] == "VALUE OF K"  # after the blocking hook changed it
    # the observer's own writes carry from stage to stage of the request...
    assert [f["state"]["watcher_calls"] for f in facts] == [1, 2, 3, 4, 5]
    assert all(isinstance(f["ended"], float) and f["ended"] <= time.time() for f in facts)
    # ...but never reach the request: its messages are not the observer's
    assert "VALUE OF K" in (result.choices[0].message.content or "")
    assert facts[3]["last"] != "an observer's change"


class Slow(Skill):
    name = "slow"

    def __init__(self) -> None:
        self.calls = 0

    @hook("on_connection", observe=True)
    async def connection(self, data: HookData, ctx: Context) -> None:
        await asyncio.sleep(0.5)
        self.calls += 1

    @hook("finalize_connection", observe=True)
    async def finalize(self, data: HookData, ctx: Context) -> None:
        await asyncio.sleep(0.5)
        self.calls += 1


async def test_no_request_waits_for_a_slow_observer() -> None:
    slow = Slow()
    agent = Agent("t", skills=[slow])
    began = time.perf_counter()
    await agent.run("hello")
    took = time.perf_counter() - began
    assert took < 0.4, f"the request waited for its observers ({took:.2f}s)"
    assert slow.calls == 0
    assert await agent.observers_idle(5)
    assert slow.calls == 2


class Raiser(Skill):
    name = "raiser"

    def __init__(self) -> None:
        self.finalized: list[str | None] = []

    @hook("on_connection", observe=True)
    def refuse(self, data: HookData, ctx: Context) -> None:
        raise PaymentRequired("an observer cannot refuse")

    @hook("before_llm_call", observe=True)
    def crash(self, data: HookData, ctx: Context) -> None:
        raise RuntimeError("boom")

    @hook("finalize_connection", observe=True)
    def finalize(self, data: HookData, ctx: Context) -> None:
        self.finalized.append(data.error.code if data.error else None)


async def test_an_observer_that_raises_stops_nothing_and_the_next_stages_are_still_observed() -> None:
    raiser = Raiser()
    agent = Agent("t", skills=[raiser])
    result = await agent.run("hello")
    assert result.choices[0].message.content
    assert await agent.observers_idle(5)
    assert raiser.finalized == [None]


class Refuser(Skill):
    name = "refuser"

    @hook("before_llm_call")
    def refuse(self, data: HookData, ctx: Context) -> None:
        raise PaymentRequired("no credit")


async def test_a_finalize_observer_sees_the_error_of_a_failed_run() -> None:
    raiser = Raiser()
    agent = Agent("t", skills=[Refuser(), raiser])
    with pytest.raises(HookError):
        await agent.run("hello")
    assert await agent.observers_idle(5)
    assert raiser.finalized == ["payment_required"]


class Recovered(Skill):
    name = "recovered"

    def __init__(self) -> None:
        self.finalized: list[tuple[str | None, bool]] = []

    @hook("finalize_connection", observe=True)
    def finalize(self, data: HookData, ctx: Context) -> None:
        self.finalized.append((data.error.code if data.error else None, ctx.recovery))


async def test_a_finalize_observer_sees_a_request_finalized_for_a_lost_orchestrator() -> None:
    recovered = Recovered()
    agent = Agent("t", skills=[recovered])
    await agent.finalize_only("hello", completion_id="chatcmpl-lost", error=OrchestratorLost())
    assert await agent.observers_idle(5)
    assert recovered.finalized == [(OrchestratorLost().code, True)]


async def test_streamed_chunks_are_observed_in_order_with_the_text_so_far() -> None:
    watcher = Watcher()
    agent = Agent("t", skills=[watcher])
    sent = [c.choices[0].delta.content async for c in agent.run_stream("[[words:5]]") if c.choices]
    assert "".join(s or "" for s in sent) == "w0 w1 w2 w3 w4"
    assert await agent.observers_idle(5)
    chunks = [f for lc, f in watcher.seen if lc == "on_chunk"]
    assert "".join(f["content"] for f in chunks) == "w0 w1 w2 w3 w4"
    assert chunks[-1]["full"].startswith("w0 w1 w2 w3 w4")


def test_an_observer_cannot_be_a_guard_or_hold_text_back() -> None:
    with pytest.raises(ValueError, match="observer"):
        hook("on_connection", observe=True, guard=True)
    with pytest.raises(ValueError, match="hold_back"):
        hook("before_llm_call", hold_back=10)
    with pytest.raises(ValueError, match="hold_back"):
        hook("on_chunk", hold_back=10, observe=True)

