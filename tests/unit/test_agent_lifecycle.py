"""The in-process agent loop: every lifecycle point, its data, order and error paths.

The LLM is the built-in offline model reached through the real openai client over HTTP.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from hookbus import Agent
from hookbus.services.orchestrator.llm.client import LLM
from hookbus.services.orchestrator.loop.llm_round import ROUND_CAP_NOTE
from hookbus.services.orchestrator.loop.runtime import LocalRuntime
from hookbus.services.testing.offline_server import OfflineModelServer
from hookbus.skills import (
    Context,
    HookbusError,
    HookData,
    HookError,
    PaymentRequired,
    Skill,
    UpstreamError,
    hook,
    tool,
)
from tests.waiting import wait_for


@pytest.fixture
def endpoint() -> Iterator[OfflineModelServer]:
    """The offline model on a server of this test's own, configured as the agent's endpoint
    (so nothing is skipped for being the built-in model), recording every request."""
    with OfflineModelServer() as server:
        yield server


class Recorder(Skill):
    """Records every lifecycle point with a copy of what it saw."""

    name = "recorder"

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def _keep(self, data: HookData) -> HookData:
        self.seen.append((data.lifecycle, data.model_dump(exclude_none=True)))
        return data

    @hook("on_connection")
    def a(self, data, ctx):
        return self._keep(data)

    @hook("before_llm_call")
    def b(self, data, ctx):
        return self._keep(data)

    @hook("after_llm_call")
    def c(self, data, ctx):
        return self._keep(data)

    @hook("on_chunk")
    def d(self, data, ctx):
        return self._keep(data)

    @hook("before_toolcall")
    def e(self, data, ctx):
        return self._keep(data)

    @hook("after_toolcall")
    def f(self, data, ctx):
        return self._keep(data)

    @hook("on_message")
    def g(self, data, ctx):
        return self._keep(data)

    @hook("finalize_connection")
    def h(self, data, ctx):
        return self._keep(data)

    def points(self) -> list[str]:
        return [name for name, _ in self.seen]

    def count(self, lifecycle: str) -> int:
        return self.points().count(lifecycle)

    def of(self, lifecycle: str) -> list[dict[str, Any]]:
        return [seen for name, seen in self.seen if name == lifecycle]


class Calculator(Skill):
    name = "calc"

    @tool
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @tool
    def explode(self) -> str:
        """Always fails."""
        raise RuntimeError("kaboom")


async def test_plain_request_fires_each_point_once_in_order():
    recorder = Recorder()
    agent = Agent("t", skills=[recorder])
    completion = await agent.run("hello there")
    assert recorder.points() == [
        "on_connection", "before_llm_call", "after_llm_call", "on_message", "finalize_connection",
    ]
    assert completion.choices[0].message.content == "Offline model reply to: hello there"
    assert completion.id.startswith("chatcmpl-")
    assert completion.usage is not None and completion.usage.total_tokens > 0


async def test_hook_data_fields_per_lifecycle_in_a_streamed_tool_run():
    recorder = Recorder()
    agent = Agent("t", skills=[recorder, Calculator()])
    chunks = [c async for c in agent.run_stream('please [[tool:add {"a": 2, "b": 3}]]')]
    connection, = recorder.of("on_connection")
    assert connection["messages"] == [{"role": "user", "content": 'please [[tool:add {"a": 2, "b": 3}]]'}]
    assert connection["stream"] is True
    first_call, second_call = recorder.of("before_llm_call")
    assert first_call["iteration"] == 0 and second_call["iteration"] == 1
    assert {t["function"]["name"] for t in first_call["tools"]} == {"add", "explode"}
    after_first = recorder.of("after_llm_call")[0]
    tool_calls = after_first["response"]["choices"][0]["message"]["tool_calls"]
    assert tool_calls[0]["function"]["name"] == "add"
    assert after_first["usage"]["total_tokens"] > 0
    before_tool, = recorder.of("before_toolcall")
    assert before_tool["tool_call"]["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
    assert before_tool["tool_id"] == tool_calls[0]["id"]
    after_tool, = recorder.of("after_toolcall")
    assert after_tool["tool_result"] == "5" and after_tool["tool_id"] == before_tool["tool_id"]
    chunk_points = recorder.of("on_chunk")
    assert [c["chunk_index"] for c in chunk_points] == list(range(len(chunk_points)))
    texts = [c.get("content", "") for c in chunk_points]
    assert chunk_points[-1]["full_content"] == "".join(texts)
    message, = recorder.of("on_message")
    roles = [m["role"] for m in message["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert message["messages"][-1]["content"] == "The tool add returned: 5"
    final, = recorder.of("finalize_connection")
    assert final["messages"] == message["messages"] and "error" not in final
    assert final["usage"]["total_tokens"] == sum(
        a["usage"]["total_tokens"] for a in recorder.of("after_llm_call")
    )
    assert all(c.id == chunks[0].id for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == final["usage"]["total_tokens"]


class Order(Skill):
    def __init__(self, name: str, log: list[str], *priorities: int) -> None:
        self.name = name
        self.log = log
        self.priorities = priorities


def ordered_skill(label: str, priority_a: int, priority_b: int, log: list[str]) -> Skill:
    class Ordered(Skill):
        name = label

        @hook("on_connection", priority_a)
        def first(self, data, ctx):
            log.append(f"{label}.first")
            data.messages.append({"role": "user", "content": f"{label}.first"})
            return data

        @hook("on_connection", priority_b)
        def second(self, data, ctx):
            log.append(f"{label}.second")
            return data

    return Ordered()


async def test_priority_orders_hooks_across_skills_and_ties_keep_registration_order():
    log: list[str] = []
    agent = Agent(
        "t", skills=[ordered_skill("x", 20, 5, log), ordered_skill("y", 5, 20, log), ordered_skill("z", 1, 5, log)]
    )
    await agent.run("go")
    assert log == ["z.first", "x.second", "y.first", "z.second", "x.first", "y.second"]


class Shouter(Skill):
    name = "shouter"

    @hook("before_llm_call", 10)
    def upper(self, data, ctx):
        data.messages = [{**m, "content": m["content"].upper()} for m in data.messages]
        return data

    @hook("before_llm_call", 20)
    def echo_marker(self, data, ctx):
        ctx.state["saw"] = data.messages[-1]["content"]
        data.messages[-1]["content"] += " [[echo]]"
        return data


async def test_a_hook_change_is_seen_by_the_next_hook_and_by_the_llm():
    shouter = Shouter()
    completion = await Agent("t", skills=[shouter]).run("quiet words")
    assert completion.choices[0].message.content == "QUIET WORDS"


class ChunkEditor(Skill):
    name = "chunks"

    @hook("on_chunk")
    def edit(self, data, ctx):
        if data.content == " w2":
            data.chunk = None  # drop it
        elif data.content == " w1":
            data.content = " W1"
        return data


async def test_on_chunk_can_rewrite_and_drop_and_the_client_sees_exactly_that():
    agent = Agent("t", skills=[ChunkEditor()])
    chunks = [c async for c in agent.run_stream("[[words:4]]")]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "w0 W1 w3"


class ToolGate(Skill):
    name = "gate"

    @hook("before_toolcall")
    def gate(self, data, ctx):
        name = data.tool_call["function"]["name"]
        if name == "explode":
            raise PermissionError("explode is not allowed")
        if data.tool_call["function"]["arguments"] == '{"a": 1, "b": 1}':
            data.tool_call = {**data.tool_call, "function": {"name": "add", "arguments": '{"a": 10, "b": 10}'}}
        if data.tool_call["function"]["arguments"] == '{"a": 7, "b": 7}':
            data.tool_skipped = True
            data.tool_result = "cached 14"
        return data

    @hook("after_toolcall")
    def annotate(self, data, ctx):
        data.tool_result = f"<{data.tool_result}>"
        return data


async def tool_results(prompt: str, *skills: Skill) -> list[str]:
    recorder = Recorder()
    await Agent("t", skills=[*skills, recorder]).run(prompt)
    message, = recorder.of("on_message")
    return [m["content"] for m in message["messages"] if m["role"] == "tool"]


async def test_before_toolcall_rewrites_skips_and_blocks():
    results = await tool_results(
        '[[tool:add {"a": 1, "b": 1}]] [[tool:add {"a": 7, "b": 7}]] [[tool:explode]]',
        Calculator(), ToolGate(),
    )
    assert results[0] == "<20>"
    assert results[1] == "<cached 14>"
    assert results[2] == "<Tool call blocked by gate.gate: PermissionError: explode is not allowed>"


class Renamer(Skill):
    """Points the model's call at a tool nobody serves."""

    @hook("before_toolcall")
    def rename(self, data, ctx):
        if data.tool_call["function"]["arguments"] == '{"rename": true}':
            data.tool_call = {**data.tool_call, "function": {"name": "nosuch", "arguments": "{}"}}
        return data


async def test_tool_problems_reach_the_model_as_tool_messages():
    results = await tool_results(
        '[[tool:add {"rename": true}]] [[tool:add {"a": "x"}]] [[tool:explode]]',
        Calculator(), Renamer(),
    )
    assert results[0].startswith("Error: unknown tool 'nosuch'; available tools: add, explode")
    assert results[1].startswith("Error: invalid arguments for tool 'add': a: Input should be a valid integer")
    assert "b: Field required" in results[1]
    assert results[2] == "Error: tool 'explode' failed: RuntimeError: kaboom"


class RawToolCall(Skill):
    """Rewrites the model's arguments into something that is not JSON."""

    @hook("before_toolcall")
    def garble(self, data, ctx):
        data.tool_call = {**data.tool_call, "function": {"name": "add", "arguments": "{oops"}}
        return data


async def test_arguments_that_are_not_json_become_a_tool_message():
    results = await tool_results('[[tool:add {"a": 1, "b": 2}]]', Calculator(), RawToolCall())
    assert results[0].startswith("Error: arguments for tool 'add' are not valid JSON")


async def test_tool_round_cap_makes_one_more_call_without_tools(endpoint: OfflineModelServer):
    recorder = Recorder()
    agent = Agent("t", skills=[recorder, Calculator()], max_tool_rounds=3, llm=LLM(endpoint.base_url))
    completion = await agent.run("[[loop:add]]")
    assert [(r.method, r.path) for r in endpoint.received] == [("POST", "/v1/chat/completions")] * 4
    calls = recorder.of("before_llm_call")
    assert len(calls) == 4
    assert all(c.get("tools") for c in calls[:3]) and "tools" not in calls[3]
    assert calls[3]["messages"][-1] == {"role": "system", "content": ROUND_CAP_NOTE}
    assert completion.choices[0].message.content == "Final answer after 3 tool calls."
    assert recorder.count("before_toolcall") == recorder.count("after_toolcall") == 3


class Scoped(Skill):
    name = "scoped"

    def __init__(self) -> None:
        self.ran: list[str] = []

    @hook("on_connection", scope="admin")
    def admin_only(self, data, ctx):
        self.ran.append(ctx.auth.peer_user_id)

    @tool(scope="admin")
    def secret(self) -> str:
        """Admins only."""
        return "s3cret"


async def test_scoped_hooks_and_tools_apply_only_to_callers_with_the_scope():
    scoped, recorder = Scoped(), Recorder()
    agent = Agent("t", skills=[scoped, recorder])
    await agent.run("[[tool:secret]]", auth={"peer_user_id": "bob", "scopes": []})
    await agent.run("[[tool:secret]]", auth={"peer_user_id": "root", "scopes": ["admin"]})
    assert scoped.ran == ["root"]
    first_tools, second_tools = (c.get("tools") for c in recorder.of("before_llm_call")[::2][:2])
    assert first_tools is None
    assert [t["function"]["name"] for t in recorder.of("before_llm_call")[1]["tools"]] == ["secret"]


# ----------------------------------------------------------------- finalize paths


class Finalizer(Skill):
    name = "final"

    def __init__(self) -> None:
        self.errors: list[HookbusError | None] = []

    @hook("finalize_connection")
    async def done(self, data, ctx):
        self.errors.append(data.error)


class Billing(Skill):
    name = "billing"

    @hook("on_connection", 1)
    async def charge(self, data, ctx):
        raise PaymentRequired("no credit left", {"balance": 0})

    @hook("on_connection", 2)
    async def never(self, data, ctx):
        raise AssertionError("must not run after a HookError")


class BrokenOwnershipCheck(LocalRuntime):
    """A runtime whose ownership check fails, as a Redis client's can mid-failover."""

    async def still_owner(self, ctx: Context) -> bool:
        raise AttributeError("'NoneType' object has no attribute 'writelines'")


async def test_finalize_runs_when_the_ownership_check_itself_fails():
    finalizer = Finalizer()
    agent = Agent("owner", skills=[finalizer], runtime=BrokenOwnershipCheck())
    completion = await agent.run("[[echo]] hello")
    assert completion.choices[0].message.content == "hello"
    assert finalizer.errors == [None]


async def test_finalize_runs_once_when_a_402_aborts_before_any_llm_call(endpoint: OfflineModelServer):
    final, recorder = Finalizer(), Recorder()
    with pytest.raises(PaymentRequired) as caught:
        await Agent("t", skills=[Billing(), final, recorder], llm=LLM(endpoint.base_url)).run("hi")
    assert endpoint.received == []  # the endpoint never heard of the refused request
    assert caught.value.details == {"balance": 0}
    assert final.errors == [PaymentRequired("no credit left", {"balance": 0})]
    assert recorder.count("before_llm_call") == 0


class Critical(Skill):
    @hook("after_llm_call", critical=True)
    def boom(self, data, ctx):
        raise ValueError("broken")


class Flaky(Skill):
    @hook("before_llm_call")
    def flaky(self, data, ctx):
        data.messages.append({"role": "user", "content": "SHOULD BE DISCARDED"})
        ctx.state["flaky"] = True
        raise RuntimeError("flaky")


async def test_a_plain_exception_discards_the_hook_changes_and_the_run_goes_on():
    final = Finalizer()
    completion = await Agent("t", skills=[Flaky(), final]).run("[[echo]] keep")
    assert completion.choices[0].message.content == "keep"
    assert final.errors == [None]


async def test_a_critical_hook_failure_aborts_as_500_and_finalize_runs_once():
    final = Finalizer()
    with pytest.raises(HookError) as caught:
        await Agent("t", skills=[Critical(), final]).run("hi")
    assert caught.value.status_code == 500 and "critical hook critical.boom failed" in caught.value.message
    assert len(final.errors) == 1 and final.errors[0].status_code == 500


async def test_an_llm_error_ends_the_run_with_finalize_once():
    final = Finalizer()
    # an upstream 500 is the endpoint failing us: the client sees a 502
    with pytest.raises(UpstreamError) as caught:
        await Agent("t", skills=[final]).run("[[error:500]]")
    assert caught.value.status_code == 502
    assert len(final.errors) == 1 and final.errors[0].code == caught.value.code


async def test_cancelling_the_caller_still_finalizes_once_with_499():
    final, recorder = Finalizer(), Recorder()
    task = asyncio.create_task(Agent("t", skills=[recorder, final]).run("[[delay:5000]] slow"))

    async def calling_the_model() -> bool:
        return bool(recorder.of("before_llm_call"))

    assert await wait_for(calling_the_model, timeout=5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(final.errors) == 1 and final.errors[0].status_code == 499


async def test_a_stream_consumer_stopping_early_finalizes_once_with_499():
    final = Finalizer()
    stream = Agent("t", skills=[final]).run_stream("[[words:50]]")
    async for _chunk in stream:
        break
    await stream.aclose()
    assert len(final.errors) == 1 and final.errors[0].code == "client_closed"


class BrokenFinalizer(Skill):
    @hook("finalize_connection", 1)
    def fails(self, data, ctx):
        raise HookError(500, "oops", "finalize broke")


async def test_a_failing_finalize_hook_never_replaces_the_original_error():
    final = Finalizer()
    with pytest.raises(PaymentRequired):
        await Agent("t", skills=[Billing(), BrokenFinalizer(), final]).run("hi")
    assert [e.status_code for e in final.errors] == [402]


async def test_hook_timeout_counts_as_a_failure():
    class Slow(Skill):
        @hook("on_connection", timeout=0.05)
        async def slow(self, data, ctx):
            await asyncio.sleep(1)  # the point: slower than its 0.05 s timeout
            data.messages.append({"role": "user", "content": "late"})
            return data

    recorder = Recorder()
    await Agent("t", skills=[Slow(), recorder]).run("hi")
    assert recorder.of("before_llm_call")[0]["messages"] == [{"role": "user", "content": "hi"}]


async def test_session_data_persists_between_requests_of_a_session():
    class Counter(Skill):
        @hook("on_connection")
        def count(self, data, ctx: Context):
            ctx.session.data["n"] = ctx.session.data.get("n", 0) + 1
            ctx.state["n"] = ctx.session.data["n"]

        @hook("finalize_connection")
        def note(self, data, ctx: Context):
            seen.append(ctx.state["n"])

    seen: list[int] = []
    agent = Agent("t", skills=[Counter()])
    for _ in range(3):
        await agent.run("hi", session_id="s1")
    await agent.run("hi", session_id="s2")
    assert seen == [1, 2, 3, 1]


def test_an_agent_can_be_used_from_several_event_loops_one_after_another():
    agent = Agent("t")
    answers = Counter(
        asyncio.run(agent.run("[[echo]] same")).choices[0].message.content for _ in range(2)
    )
    assert answers == {"same": 2}
