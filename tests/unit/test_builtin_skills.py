"""The built-in skills, driven through a real Agent and the offline model.

Also proves the statelessness rule: a request's hooks may run on different replicas, so
every hook is run on a fresh instance with a context that went through JSON on the way.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
import structlog
from openai.types.chat import ChatCompletionChunk
from structlog.testing import capture_logs

from hookbus import Agent
from hookbus.skills import Context, HookData, PaymentRequired, Skill, hook, tool
from hookbus.skills.builtin import (
    AnalyticsSkill,
    ContentFilter,
    PerformanceMonitor,
    RequestLogger,
    SecuritySkill,
)
from hookbus.skills.context import Metadata


@pytest.fixture(autouse=True)
def default_structlog():
    """capture_logs sees info lines even if another test configured a higher log level."""
    saved = structlog.get_config()
    structlog.reset_defaults()
    yield
    structlog.configure(**saved)


class Toolbox(Skill):
    """Tools for the model to call; records which ones really ran."""

    name = "toolbox"

    def __init__(self) -> None:
        self.ran: list[str] = []

    @tool
    def shell(self, cmd: str) -> str:
        """Run a shell command."""
        self.ran.append(f"shell {cmd}")
        return "shell ran"

    @tool
    def run_query(self, sql: str) -> str:
        """Run SQL."""
        self.ran.append(f"sql {sql}")
        return "1 row"

    @tool
    async def nap(self, ms: int) -> str:
        """Sleep for ms milliseconds."""
        self.ran.append(f"nap {ms}")
        await asyncio.sleep(ms / 1000)  # the point: a tool that takes its time
        return f"slept {ms}"


class Billing(Skill):
    """Refuses every request before any other on_connection hook runs."""

    name = "billing"

    @hook("on_connection", -1)
    def charge(self, data, ctx):
        raise PaymentRequired("no credit left")


class StateProbe(Skill):
    """Keeps what ctx.state held at the very end of each request."""

    name = "probe"

    def __init__(self) -> None:
        self.states: list[dict[str, Any]] = []

    @hook("finalize_connection", 10_000, observe=True)
    def keep(self, data, ctx):
        """An observer: it sees the request's state and the observers' own (the built-in
        watchers keep theirs there)."""
        self.states.append(json.loads(json.dumps(ctx.state)))  # also proves it is plain JSON


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


def travel(ctx: Context) -> Context:
    """The context as another replica receives it."""
    return Context.model_validate_json(ctx.model_dump_json())


def new_ctx(**state: Any) -> Context:
    return Context(
        metadata=Metadata(completion_id="chatcmpl-test", model="offline", agent_name="t"),
        state=state,
    )


def tool_messages(content: str) -> list[str]:
    return [line for line in content.splitlines() if line.startswith("The tool ")]


# ------------------------------------------------------------------ RequestLogger


async def test_request_logger_logs_duration_usage_outcome_and_message_count():
    agent = Agent("t", skills=[RequestLogger()])
    with capture_logs() as logs:
        completion = await agent.run("hello", auth={"peer_user_id": "alice"})
        assert await agent.observers_idle(5)
    (line,) = events(logs, "request_completed")
    assert line["completion_id"] == completion.id
    assert line["log_level"] == "info"
    assert isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0
    usage = completion.usage
    assert (line["prompt_tokens"], line["completion_tokens"], line["total_tokens"]) == (
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.total_tokens,
    )
    assert line["total_tokens"] > 0
    assert line["outcome"] == "ok" and line["status_code"] == 200 and line["error_code"] is None
    assert line["messages"] == 2  # the user message and the answer
    assert line["caller"] == "alice" and line["agent"] == "t" and line["model"] == "offline"


async def test_request_logger_finalize_is_safe_when_on_connection_never_ran():
    agent = Agent("t", skills=[Billing(), RequestLogger()])
    with capture_logs() as logs:
        with pytest.raises(PaymentRequired):
            await agent.run("hi")
        assert await agent.observers_idle(5)
    (line,) = events(logs, "request_completed")
    assert line["duration_ms"] is None
    assert line["total_tokens"] == 0
    assert line["outcome"] == "402 payment_required" and line["status_code"] == 402
    assert line["log_level"] == "warning"


async def test_request_logger_finalize_with_no_context_at_all_logs_once():
    logger, ctx = RequestLogger(), new_ctx()
    data = HookData(lifecycle="finalize_connection")
    with capture_logs() as logs:
        await logger.log_request(data, ctx)
        await logger.log_request(data, ctx)  # idempotent for the same request state
    (line,) = events(logs, "request_completed")
    assert line["duration_ms"] is None and line["messages"] == 0 and line["outcome"] == "ok"


def test_request_logger_level_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("HOOKBUS_REQUEST_LOG_LEVEL", "DEBUG")
    assert RequestLogger().level == "debug"
    assert RequestLogger(level="warn").level == "warning"
    with pytest.raises(ValueError, match="unknown log level"):
        RequestLogger(level="loud")


# ------------------------------------------------------------------- SecuritySkill


async def test_security_blocks_a_dangerous_tool_and_the_model_is_told():
    box = Toolbox()
    completion = await Agent("t", skills=[SecuritySkill(), box]).run('[[tool:shell {"cmd": "ls"}]]')
    (message,) = tool_messages(completion.choices[0].message.content)
    assert message.startswith(
        "The tool shell returned: Tool call blocked by security.check_tool_call: PermissionError:"
    )
    assert "'shell' is not allowed" in message
    assert box.ran == []


async def test_security_blocks_dangerous_arguments_case_insensitively_and_lets_the_rest_run():
    box = Toolbox()
    prompt = (
        '[[tool:run_query {"sql": "select 1"}]] '
        '[[tool:run_query {"sql": "drop TABLE users"}]] '
        '[[tool:run_query {"sql": "x; RM   -Rf /"}]] '
        '[[tool:run_query {"sql": "rm\\u0020-rf /"}]]'
    )
    completion = await Agent("t", skills=[SecuritySkill(), box]).run(prompt)
    first, *blocked = tool_messages(completion.choices[0].message.content)
    assert first == "The tool run_query returned: 1 row"
    assert len(blocked) == 3
    assert all("Tool call blocked by security.check_tool_call" in m for m in blocked)
    assert "dangerous pattern" in blocked[0] and "'drop TABLE'" in blocked[0]
    assert box.ran == ["sql select 1"]


def test_security_configuration_from_arguments_and_environment(monkeypatch):
    call = {"function": {"name": "Shell", "arguments": '{"cmd": "ls"}'}}
    assert SecuritySkill().violation(call) is not None  # default list, any case
    assert SecuritySkill(blocked_tools=[]).violation(call) is None
    monkeypatch.setenv("HOOKBUS_BLOCKED_TOOLS", "nap, run_query")
    monkeypatch.setenv("HOOKBUS_BLOCKED_PATTERNS", r"format\s+c:,secret")
    skill = SecuritySkill()
    assert skill.blocked_tools == {"nap", "run_query"}
    assert skill.violation(call) is None
    assert "format" in skill.violation(
        {"function": {"name": "x", "arguments": '{"a": "FORMAT C:"}'}}
    )
    assert skill.violation({"function": {"name": "x", "arguments": "not json: Secret"}})
    monkeypatch.setenv("HOOKBUS_BLOCKED_PATTERNS", "")
    monkeypatch.setenv("HOOKBUS_SECURITY_SHELL_CHECKS", "0")
    assert (
        SecuritySkill(blocked_tools="").violation(
            {"function": {"name": "shell", "arguments": '{"cmd": "rm -rf /"}'}}
        )
        is None
    )


# ------------------------------------------------------------------- ContentFilter


async def test_content_filter_masks_user_input_before_the_llm_and_in_the_conversation():
    probe = Recorder()
    completion = await Agent("t", skills=[ContentFilter(), probe]).run(
        "[[echo]] you Damn fool, damnation is CRAP"
    )
    assert completion.choices[0].message.content == "you *** fool, damnation is ***"
    (user,) = [m for m in probe.conversation if m["role"] == "user"]
    assert user["content"] == "[[echo]] you *** fool, damnation is ***"


async def test_content_filter_replaces_a_flagged_streamed_word_with_filtered():
    agent = Agent("t", skills=[ContentFilter(banned_words=[], flagged_words=["classified"])])
    chunks = [c async for c in agent.run_stream("[[echo]] the classified plan")]
    texts = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(texts) == "the [filtered] plan"
    assert "[filtered] plan" in texts and not any("classified" in t for t in texts)


async def test_content_filter_holds_back_a_phrase_split_over_chunks():
    probe = Recorder()
    skills = [ContentFilter(flagged_words="top secret"), probe]
    chunks = [
        c
        async for c in Agent("t", skills=skills).run_stream(
            "[[echo]] a top secret plan, top dog and top secret"
        )
    ]
    texts = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(texts) == "a [filtered] plan, top dog and [filtered]"
    assert probe.conversation[-1]["content"] == "a [filtered] plan, top dog and [filtered]"


async def test_content_filter_without_hold_back_filters_only_the_completing_chunk():
    skills = [ContentFilter(flagged_words="top secret", hold_back=False)]
    chunks = [c async for c in Agent("t", skills=skills).run_stream("[[echo]] a top secret plan")]
    texts = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(texts) == "a top[filtered] plan"  # " top" had already gone out


async def test_content_filter_filters_a_non_streamed_answer():
    agent = Agent("t", skills=[ContentFilter(banned_words=[], flagged_words=["classified"])])
    completion = await agent.run("[[echo]] the Classified plan, declassified")
    assert completion.choices[0].message.content == "the [filtered] plan, declassified"


def chunk(text: str | None, finish: str | None = None) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate(
        {
            "id": "chatcmpl-test",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "offline",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
        }
    )


async def stream_through_replicas(pieces: list[str], **config: Any) -> list[str]:
    """Each chunk on a fresh ContentFilter with a context that travelled as JSON."""
    ctx, full, seen = new_ctx(), "", []
    frames = [("", None), *((p, None) for p in pieces), ("", "stop")]
    for index, (piece, finish) in enumerate(frames):
        full += piece
        data = HookData(
            lifecycle="on_chunk",
            chunk=chunk(piece, finish),
            content=piece,
            chunk_index=index,
            full_content=full,
        )
        ctx = travel(ctx)
        result = await ContentFilter(**config).filter_chunk(data, ctx) or data
        seen.append(result.content)
    return seen


async def test_content_filter_holds_a_word_split_mid_word_across_replicas():
    seen = await stream_through_replicas(
        ["the clas", "sified", " plan"], flagged_words=["classified"]
    )
    assert seen == ["", "the ", "", "[filtered] plan", ""]
    harmless = await stream_through_replicas(["the clas", "sic plan"], flagged_words=["classified"])
    assert "".join(harmless) == "the classic plan"
    tail = await stream_through_replicas(["ends with clas"], flagged_words=["classified"])
    assert tail == ["", "ends with ", "clas"]  # held text goes out with the finish chunk


def test_content_filter_configuration_from_the_environment(monkeypatch):
    monkeypatch.setenv("HOOKBUS_BANNED_WORDS", "foo, bar baz")
    skill = ContentFilter()
    assert skill.banned_words == ("foo", "bar baz") and skill.flagged_words == ("foo", "bar baz")
    assert skill.clean("Foo and BAR BAZ but food") == "*** and *** but food"
    monkeypatch.setenv("HOOKBUS_FLAGGED_WORDS", "qux")
    assert ContentFilter().filter_output("qux foo") == "[filtered] foo"
    monkeypatch.setenv("HOOKBUS_BANNED_WORDS", "")
    assert ContentFilter().clean("foo") == "foo"


class Recorder(Skill):
    """Keeps the final conversation (after every on_message hook)."""

    name = "recorder"

    def __init__(self) -> None:
        self.conversation: list[dict[str, Any]] = []

    @hook("finalize_connection")
    def keep(self, data, ctx):
        self.conversation = copy.deepcopy(data.messages or [])


# -------------------------------------------------------------- PerformanceMonitor


async def test_performance_monitor_times_each_tool_call_by_tool_id():
    probe = StateProbe()
    agent = Agent("t", skills=[PerformanceMonitor(), Toolbox(), probe])
    with capture_logs() as logs:
        completion = await agent.run('[[tool:nap {"ms": 60}]] [[tool:nap {"ms": 10}]]')
        assert await agent.observers_idle(5)
    perf = probe.states[0]["perf"]
    tools = perf["tools"]
    assert len(tools) == 2  # the same tool twice: two entries, one per tool_id
    slow_id, fast_id = sorted(tools, key=lambda key: tools[key]["ms"], reverse=True)
    assert tools[slow_id]["name"] == tools[fast_id]["name"] == "nap"
    assert tools[slow_id]["ms"] >= 60 and 10 <= tools[fast_id]["ms"] < tools[slow_id]["ms"]
    assert (
        perf["stats"]["nap"]["calls"] == 2
        and perf["stats"]["nap"]["max_ms"] == tools[slow_id]["ms"]
    )
    (summary,) = events(logs, "performance_summary")
    assert summary["completion_id"] == completion.id
    assert summary["tool_calls"] == 2 and set(summary["tool_ms"]) == {slow_id, fast_id}
    assert summary["slowest"] == {"tool_id": slow_id, "name": "nap", "ms": tools[slow_id]["ms"]}
    assert summary["llm_calls"] == 2 and summary["total_tokens"] == completion.usage.total_tokens


async def test_performance_monitor_copes_with_a_blocked_call_and_a_refused_request():
    agent = Agent("t", skills=[SecuritySkill(), PerformanceMonitor(), Toolbox()])
    with capture_logs() as logs:
        await agent.run('[[tool:shell {"cmd": "ls"}]]')
        assert await agent.observers_idle(5)
    (summary,) = events(logs, "performance_summary")
    assert summary["tool_calls"] == 1 and summary["slowest"] is None
    assert summary["tools"]["shell"] == {"calls": 1, "timed": 0, "total_ms": 0.0, "max_ms": None}
    refusing = Agent("t", skills=[Billing(), PerformanceMonitor()])
    with capture_logs() as logs:
        with pytest.raises(PaymentRequired):
            await refusing.run("hi")
        assert await refusing.observers_idle(5)
    (summary,) = events(logs, "performance_summary")
    assert summary["tool_calls"] == 0 and summary["llm_calls"] == 0


async def test_performance_monitor_warns_about_a_slow_tool(monkeypatch):
    monkeypatch.setenv("HOOKBUS_SLOW_TOOL_MS", "20")
    assert PerformanceMonitor().slow_tool_ms == 20
    napping = Agent("t", skills=[PerformanceMonitor(), Toolbox()])
    with capture_logs() as logs:
        await napping.run('[[tool:nap {"ms": 40}]]')
        assert await napping.observers_idle(5)
    (warning,) = events(logs, "slow_tool_call")
    assert warning["tool"] == "nap" and warning["ms"] >= 40 and warning["log_level"] == "warning"


# ------------------------------------------------------------------ AnalyticsSkill


async def test_analytics_counts_per_request_and_in_aggregate():
    analytics, probe = AnalyticsSkill(), StateProbe()
    agent = Agent("helper", skills=[Billing(), analytics, Toolbox(), probe])
    agent_ok = Agent("helper", skills=[analytics, Toolbox(), probe])
    with capture_logs() as logs:
        await agent_ok.run('[[tool:nap {"ms": 1}]]')
        chunks = [c async for c in agent_ok.run_stream("[[words:3]]")]
        with pytest.raises(PaymentRequired):
            await agent.run("hi")
        assert await agent_ok.observers_idle(5) and await agent.observers_idle(5)
    tool_run, streamed, refused = (state["analytics"] for state in probe.states)
    assert tool_run["lifecycles"] == {
        "on_connection": 1,
        "before_llm_call": 2,
        "after_llm_call": 2,
        "before_toolcall": 1,
        "after_toolcall": 1,
        "on_message": 1,
        "finalize_connection": 1,
    }
    assert tool_run["model"] == "offline" and tool_run["agent"] == "helper"
    assert streamed["lifecycles"]["on_chunk"] == len(chunks)  # the usage chunk included
    assert refused["lifecycles"] == {"finalize_connection": 1}
    assert [line["outcome"] for line in events(logs, "request_analytics")] == [
        "ok",
        "ok",
        "payment_required",
    ]
    snapshot = analytics.snapshot()
    assert snapshot["requests"] == 3
    assert snapshot["models"] == {"offline": 3} and snapshot["agents"] == {"helper": 3}
    assert snapshot["outcomes"] == {"ok": 2, "payment_required": 1}
    assert snapshot["lifecycles"]["on_connection"] == 2
    assert snapshot["lifecycles"]["finalize_connection"] == 3
    assert snapshot["lifecycles"]["on_chunk"] == len(chunks)
    analytics.reset()
    assert analytics.snapshot()["requests"] == 0


async def test_analytics_aggregates_are_safe_under_concurrency_and_redelivery():
    analytics = AnalyticsSkill()
    agent = Agent("t", skills=[analytics])
    await asyncio.gather(*(agent.run(f"hello {n}") for n in range(20)))
    assert await agent.observers_idle(5)
    assert analytics.snapshot()["requests"] == 20
    ctx, data = new_ctx(), HookData(lifecycle="finalize_connection")
    await analytics.record_request(data, ctx)
    await analytics.record_request(data, travel(new_ctx()))  # redelivered, state lost
    await analytics.record_request(data, ctx)
    assert analytics.snapshot()["requests"] == 21


# ------------------------------------------------------- state travels with a request


async def test_every_hook_works_on_a_fresh_instance_with_a_json_round_tripped_context():
    ctx = new_ctx()
    ctx.auth.peer_user_id = "alice"
    await RequestLogger().start(HookData(lifecycle="on_connection", messages=[], stream=False), ctx)
    tool_call = {"id": "call_1", "function": {"name": "nap", "arguments": "{}"}}
    before = HookData(lifecycle="before_toolcall", tool_call=tool_call, tool_id="call_1")
    await SecuritySkill().check_tool_call(before, travel(ctx))
    await PerformanceMonitor().tool_started(before, ctx)
    await AnalyticsSkill().count_connection(HookData(lifecycle="on_connection"), ctx)
    await asyncio.sleep(0.02)  # the point: the tool call takes >= 20 ms, which the monitor measures
    ctx = travel(ctx)  # another replica
    after = HookData(
        lifecycle="after_toolcall", tool_call=tool_call, tool_id="call_1", tool_result="ok"
    )
    await PerformanceMonitor().tool_finished(after, ctx)
    assert ctx.state["perf"]["tools"]["call_1"]["ms"] >= 20
    ctx = travel(ctx)
    final = HookData(lifecycle="finalize_connection", messages=[{"role": "user", "content": "x"}])
    with capture_logs() as logs:
        await RequestLogger().log_request(final, ctx)
        await PerformanceMonitor().log_summary(final, ctx)
        await AnalyticsSkill().record_request(final, ctx)
    (request,) = events(logs, "request_completed")
    assert request["duration_ms"] >= 20 and request["caller"] == "alice"
    (summary,) = events(logs, "performance_summary")
    assert summary["slowest"]["tool_id"] == "call_1"
    (counts,) = events(logs, "request_analytics")
    assert counts["lifecycles"] == {"on_connection": 1, "finalize_connection": 1}


async def test_no_per_request_state_is_kept_on_the_skill_instances():
    stateless = [
        RequestLogger(),
        SecuritySkill(),
        ContentFilter(flagged_words="classified"),
        PerformanceMonitor(),
    ]
    before = [copy.deepcopy(vars(skill)) for skill in stateless]
    probe = StateProbe()
    agent = Agent("t", skills=[*stateless, AnalyticsSkill(), Toolbox(), probe])
    await agent.run('[[tool:nap {"ms": 1}]] [[tool:shell {"cmd": "ls"}]]')
    [c async for c in agent.run_stream("[[echo]] damn classified")]
    assert await agent.observers_idle(5)
    assert [vars(skill) for skill in stateless] == before
    for state in probe.states:
        assert set(state) <= {"request_logger", "perf", "analytics", "content_filter"}
