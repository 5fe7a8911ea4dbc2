"""Compaction through the Agent: the policy attribute, the two public entry points, the
in-run safety stop, the context-too-long retry, and on_compaction.

The LLM is the built-in offline model over real HTTP. Its summary of a compaction request
is deterministic: "Summary: [Focus: X. ]user: <first 40 chars of the transcript>".
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from pydantic import ValidationError

from hookbus import Agent, Compaction, CompactionPolicy
from hookbus.services.orchestrator.compaction.rules import (
    SUMMARY_HEADER,
    SUMMARY_INSTRUCTION,
    is_summary,
)
from hookbus.services.orchestrator.compaction.tokens import count_messages
from hookbus.services.orchestrator.compaction.user_quotes import QUOTES_HEADER
from hookbus.services.orchestrator.llm.client import LLM
from hookbus.skills import ContextTooLong, Skill, hook, tool
from tests.conversations import SYSTEM, conversation

TRANSCRIPT_HEAD = "Conversation to summarize: [user] Questi"  # the offline summary's 40 chars


class RecordingLLM(LLM):
    """The real adapter, remembering every call: (kind, model, messages, usage)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict[str, Any]] = []

    async def complete(self, model, messages, tools, settings=None):  # type: ignore[no-untyped-def]
        entry = {"kind": "complete", "model": model, "messages": copy.deepcopy(messages)}
        self.calls.append(entry)
        response = await super().complete(model, messages, tools, settings)
        entry["usage"] = response.usage
        return response

    async def stream(self, model, messages, tools, settings=None):  # type: ignore[no-untyped-def]
        entry = {"kind": "stream", "model": model, "messages": copy.deepcopy(messages)}
        self.calls.append(entry)
        async for chunk in super().stream(model, messages, tools, settings):
            if chunk.usage is not None:
                entry["usage"] = chunk.usage
            yield chunk

    def summaries(self) -> list[dict[str, Any]]:
        return [c for c in self.calls if _is_summary_request(c["messages"])]

    def turns(self) -> list[dict[str, Any]]:
        return [c for c in self.calls if not _is_summary_request(c["messages"])]


def _is_summary_request(messages: list[dict[str, Any]]) -> bool:
    first = messages[0] if messages else {}
    return first.get("role") == "system" and SUMMARY_INSTRUCTION in str(first.get("content"))


class Listener(Skill):
    name = "listener"

    def __init__(self) -> None:
        self.calls: list[tuple[Compaction, Any]] = []

    async def on_compaction(self, outcome, ctx):  # type: ignore[no-untyped-def]
        self.calls.append((outcome, ctx))


class SyncListener(Skill):
    name = "sync-listener"

    def __init__(self) -> None:
        self.stages: list[str] = []

    def on_compaction(self, outcome, ctx):  # type: ignore[no-untyped-def]
        self.stages.append(outcome.stage)


class Broken(Skill):
    name = "broken"

    async def on_compaction(self, outcome, ctx):  # type: ignore[no-untyped-def]
        raise RuntimeError("listener down")


class Blobs(Skill):
    """A tool whose output is large: a tool loop over it overflows a 4096-token window."""

    name = "blobs"

    @tool
    def fetch(self, n: int) -> str:
        """Fetch blob n."""
        return f"blob {n}: " + " ".join(f"item{i}" for i in range(400))


class ConversationSpy(Skill):
    name = "spy"

    def __init__(self) -> None:
        self.final: list[dict[str, Any]] = []
        self.prompts: list[list[dict[str, Any]]] = []

    @hook("before_llm_call")
    def before(self, data, ctx):  # type: ignore[no-untyped-def]
        self.prompts.append(copy.deepcopy(data.messages))

    @hook("on_message")
    def done(self, data, ctx):  # type: ignore[no-untyped-def]
        self.final = copy.deepcopy(data.messages)




# ------------------------------------------------------------------------- the policy


def test_the_policy_defaults_and_is_replaced_as_a_whole() -> None:
    agent = Agent("a", model="offline-small")
    assert agent.compaction_policy == CompactionPolicy()
    assert agent.last_compaction is None
    assert agent.context_window == 4096
    with pytest.raises(ValidationError):
        agent.compaction_policy.at = 0.5  # type: ignore[misc]
    agent.compaction_policy = CompactionPolicy(at=0.7)
    assert agent.compaction_policy.at == 0.7
    agent.compaction_policy = CompactionPolicy(window=1000)
    assert agent.context_window == 1000


def test_an_invalid_policy_is_refused_on_assignment() -> None:
    agent = Agent("a", model="offline-tiny")
    with pytest.raises(TypeError, match="CompactionPolicy"):
        agent.compaction_policy = {"at": 0.7}  # type: ignore[assignment]
    with pytest.raises(ValueError, match="must be below hard"):
        agent.compaction_policy = CompactionPolicy(at=2000, hard=3000)  # both capped at 1024
    with pytest.raises(ValueError, match="must be below hard"):
        Agent("b", model="offline-tiny", compaction_policy=CompactionPolicy(at=2000, hard=3000))
    assert agent.compaction_policy == CompactionPolicy()


# ------------------------------------------------------------ between turns, on demand


async def test_compact_if_needed_below_the_threshold_does_nothing() -> None:
    llm = RecordingLLM()
    listener = Listener()
    agent = Agent("a", llm=llm, skills=[listener], compaction_policy=CompactionPolicy(window=1000))
    messages = conversation(2)
    outcome = await agent.compact_if_needed(messages, 20)
    assert outcome.stage == "none"
    assert outcome.messages == messages and outcome.before == outcome.after == count_messages(messages)
    assert outcome.sentence() == f"No compaction needed. Context {round(outcome.after / 10)}% full."
    assert llm.calls == [] and listener.calls == [] and agent.last_compaction is None


async def test_compact_if_needed_summarizes_the_older_part_exactly() -> None:
    llm = RecordingLLM()
    listener = Listener()
    agent = Agent(
        "a", model="offline-small", llm=llm, skills=[listener],
        compaction_policy=CompactionPolicy(window=1000, model="offline"),
    )
    messages = conversation(6)  # 826 tokens; at = 800
    original = copy.deepcopy(messages)

    outcome = await agent.compact_if_needed(messages, 20)

    assert messages == original  # never changed
    assert outcome.stage == "summarized"
    assert (outcome.before, outcome.window, outcome.target) == (826, 1000, 580)
    assert (outcome.summarized, outcome.kept, outcome.cleared, outcome.dropped) == (9, 3, 0, 0)
    assert outcome.summary == f"Summary: user: {TRANSCRIPT_HEAD}"
    assert outcome.messages[0] == SYSTEM and outcome.messages[2:] == original[-3:]
    summary = outcome.messages[1]["content"]
    assert summary.startswith(f"{SUMMARY_HEADER}\nSummary: user: {TRANSCRIPT_HEAD}\n\n{QUOTES_HEADER}\n")
    assert summary.endswith("> Question 0: alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha alpha…\n"
                            "[4 more of the user's messages are not quoted]")  # the first, clipped to the room left
    assert outcome.after == count_messages(outcome.messages) <= outcome.target
    assert outcome.sentence() == (
        f"Compacted the conversation: summarized 9 messages, kept 3. "
        f"Context {round(100 * outcome.after / 1000)}% full."
    )
    # one plain call, with the policy's summary model and no tools
    assert [(c["kind"], c["model"]) for c in llm.calls] == [("complete", "offline")]
    assert SUMMARY_INSTRUCTION in llm.calls[0]["messages"][0]["content"]
    assert agent.last_compaction is outcome
    assert listener.calls == [(outcome, None)]

    # the compacted conversation plus the next message is well under `at` again
    again = await agent.compact_if_needed(outcome.messages, 20)
    assert again.stage == "none" and len(listener.calls) == 1 and agent.last_compaction is outcome


async def test_the_summary_uses_the_agents_model_without_a_policy_model() -> None:
    llm = RecordingLLM()
    agent = Agent("a", model="offline-small", llm=llm, compaction_policy=CompactionPolicy(window=1000))
    await agent.compact_if_needed(conversation(6), 20)
    assert [c["model"] for c in llm.calls] == ["offline-small"]


async def test_forced_compaction_carries_the_focus_into_the_summary_prompt() -> None:
    llm = RecordingLLM()
    agent = Agent("a", llm=llm, compaction_policy=CompactionPolicy(window=1000))
    messages = conversation(3)
    original = copy.deepcopy(messages)

    outcome = await agent.compact(messages, focus="the budget decisions")

    assert messages == original
    prompt = llm.calls[0]["messages"][0]["content"]
    assert prompt.splitlines()[-1] == "Focus: the budget decisions"
    assert outcome.stage == "summarized" and outcome.focus == "the budget decisions"
    assert outcome.summary == f"Summary: Focus: the budget decisions. user: {TRANSCRIPT_HEAD}"
    assert (outcome.summarized, outcome.kept) == (4, 2)
    assert outcome.messages[0] == SYSTEM and is_summary(outcome.messages[1])
    assert outcome.messages[2:] == original[-2:]  # the latest exchange, verbatim
    assert agent.last_compaction is outcome


async def test_the_users_words_survive_the_offline_models_summary() -> None:
    """The offline model's summary is the transcript's first 40 characters: the fact given in
    the first message is not in it, but the summary message still holds it, word for word."""
    fact = "My cat is called Pixel; the report is due on 2026-12-24."
    messages = [SYSTEM, {"role": "user", "content": fact}, {"role": "assistant", "content": "Noted."}]
    messages += conversation(3)[1:]
    agent = Agent("a", compaction_policy=CompactionPolicy(window=1000))

    outcome = await agent.compact(messages, focus="the deadline")

    assert outcome.stage == "summarized" and outcome.summary is not None
    assert "Pixel" not in outcome.summary  # the model's part lost it
    assert outcome.messages[1]["content"].endswith(
        f"\n\n{QUOTES_HEADER}\n> {fact}\n[2 more of the user's messages are not quoted]"
    )
    assert outcome.messages[2:] == messages[-2:]  # the latest exchange is not quoted: it is kept


async def test_compact_with_nothing_before_the_latest_exchange_changes_nothing() -> None:
    llm = RecordingLLM()
    listener = Listener()
    agent = Agent("a", llm=llm, skills=[listener])
    outcome = await agent.compact(conversation(1))
    assert outcome.stage == "none" and llm.calls == [] and listener.calls == []


async def test_on_compaction_failures_are_logged_and_every_listener_still_runs() -> None:
    first, last, sync = Listener(), Listener(), SyncListener()
    agent = Agent(
        "a", skills=[first, Broken(), sync, last], compaction_policy=CompactionPolicy(window=1000)
    )
    outcome = await agent.compact(conversation(3))
    assert outcome.stage == "summarized"
    assert first.calls == [(outcome, None)] and last.calls == [(outcome, None)]
    assert sync.stages == ["summarized"]


async def test_an_agent_compacts_from_several_event_loops_one_after_another() -> None:
    agent = Agent("a", compaction_policy=CompactionPolicy(window=1000))
    first = await agent.compact(conversation(3))
    second = await asyncio.to_thread(asyncio.run, agent.compact(conversation(3)))
    assert first.summary == second.summary and second.stage == "summarized"


# ------------------------------------------------------------------ inside one run


async def test_a_tool_loop_that_would_overflow_fails_without_compaction() -> None:
    agent = Agent(
        "a", model="offline-small", skills=[Blobs()], max_tool_rounds=30,
        compaction_policy=CompactionPolicy(auto=False),
    )
    with pytest.raises(ContextTooLong) as caught:
        await agent.run("[[loop:fetch]] read every blob")
    assert caught.value.code == "context_length_exceeded"
    assert agent.last_compaction is None


@pytest.mark.parametrize("streamed", [False, True])
async def test_the_in_run_safety_stop_keeps_a_tool_loop_inside_the_window(streamed: bool) -> None:
    llm = RecordingLLM()
    listener, spy = Listener(), ConversationSpy()
    agent = Agent(
        "a", model="offline-small", llm=llm, skills=[Blobs(), listener, spy], max_tool_rounds=30
    )
    request = [{"role": "user", "content": "[[loop:fetch]] read every blob"}]
    original = copy.deepcopy(request)

    if streamed:
        chunks = [c async for c in agent.run_stream(request)]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        completion_id = chunks[0].id
    else:
        result = await agent.run(request)
        text, completion_id = result.choices[0].message.content, result.id

    assert text == "Final answer after 30 tool calls."
    assert request == original
    hard = CompactionPolicy().resolve(4096).hard
    turns = llm.turns()
    assert len(turns) == 31 and llm.summaries() == []  # only tool outputs needed clearing
    assert all(count_messages(c["messages"]) <= hard for c in turns)
    # the turn in progress is whole: its user message is in every prompt
    assert all(c["messages"][0] == original[0] for c in turns)
    # each change was announced once, with the run's context
    assert listener.calls and all(o.stage == "cleared" for o, _ in listener.calls)
    assert {ctx.completion_id for _, ctx in listener.calls} == {completion_id}
    assert agent.last_compaction is listener.calls[-1][0]
    # the run's conversation was replaced: what on_message sees carries the cleared notes
    notes = [m for m in spy.final if str(m.get("content")).startswith("[tool output cleared: fetch")]
    assert len(notes) == sum(o.cleared for o, _ in listener.calls)
    assert count_messages(spy.final) < 4096


async def test_the_in_run_stop_summarizes_earlier_turns_and_leaves_request_usage_alone() -> None:
    llm = RecordingLLM()
    listener = Listener()
    agent = Agent(
        "a", model="offline-small", llm=llm, skills=[Blobs(), listener], max_tool_rounds=3
    )
    history = conversation(12, words=120)  # about 3000 tokens of earlier turns
    request = [*history, {"role": "user", "content": "[[loop:fetch]] read three blobs"}]
    original = copy.deepcopy(request)

    result = await agent.run(request)

    assert result.choices[0].message.content == "Final answer after 3 tool calls."
    assert request == original
    # round 1 (the first tool output) passes `hard`: the earlier turns become a summary
    assert [o.stage for o, _ in listener.calls] == ["summarized"] and len(llm.summaries()) == 1
    summarized = listener.calls[0][0]
    assert (summarized.summarized, summarized.kept, summarized.target) == (23, 4, 2457)
    assert summarized.messages[0] == SYSTEM and is_summary(summarized.messages[1])
    assert "\n> Question 0: alpha" in summarized.messages[1]["content"]  # the user's first words, quoted
    assert summarized.messages[2:4] == original[-2:]  # last answer kept, the turn whole
    assert [m["role"] for m in summarized.messages[4:]] == ["assistant", "tool"]
    # every prompt after the stop starts with the system prompt and the summary
    later = llm.turns()[1:]
    assert later and all(is_summary(c["messages"][1]) for c in later)
    # the summary call's usage is not the request's
    assert result.usage is not None
    assert result.usage.prompt_tokens == sum(c["usage"].prompt_tokens for c in llm.turns())
    assert result.usage.completion_tokens == sum(c["usage"].completion_tokens for c in llm.turns())


# ---------------------------------------------------------- context too long: retry once


def tiny_agent(llm: LLM, *skills: Skill) -> Agent:
    """offline-tiny refuses prompts over 1024 tokens, but the policy believes in 4096: our
    own count never stops the run, so only the endpoint's refusal can."""
    return Agent(
        "a", model="offline-tiny", llm=llm, skills=list(skills),
        compaction_policy=CompactionPolicy(window=4096, model="offline"),
    )


@pytest.mark.parametrize("streamed", [False, True])
async def test_context_too_long_compacts_and_retries_once(streamed: bool) -> None:
    llm = RecordingLLM()
    listener = Listener()
    agent = tiny_agent(llm, listener)
    request = [*conversation(8), {"role": "user", "content": "[[echo]] and now?"}]
    assert 1024 < count_messages(request) < CompactionPolicy().resolve(4096).hard
    original = copy.deepcopy(request)

    if streamed:
        chunks = [c async for c in agent.run_stream(request)]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        text = (await agent.run(request)).choices[0].message.content

    assert text == "and now?"
    assert request == original
    kinds = ["summary" if _is_summary_request(c["messages"]) else "turn" for c in llm.calls]
    assert kinds == ["turn", "summary", "turn"]
    retry = llm.calls[-1]["messages"]
    assert count_messages(retry) <= 1024
    assert retry[0] == SYSTEM and is_summary(retry[1]) and retry[-1] == original[-1]
    assert [o.stage for o, _ in listener.calls] == ["summarized"]
    assert listener.calls[0][1] is not None


async def test_context_too_long_gives_up_when_compaction_cannot_help() -> None:
    llm = RecordingLLM()
    listener = Listener()
    agent = tiny_agent(llm, listener)
    huge = [{"role": "user", "content": "[[echo]] " + " ".join(["gamma"] * 1500)}]
    with pytest.raises(ContextTooLong) as caught:
        await agent.run(huge)
    assert caught.value.status_code == 400 and caught.value.code == "context_length_exceeded"
    assert len(llm.calls) == 1 and listener.calls == []  # nothing to compact: no retry


async def test_context_too_long_is_retried_only_once() -> None:
    llm = RecordingLLM()
    listener = Listener()
    agent = tiny_agent(llm, listener)
    request = [*conversation(4), {"role": "user", "content": "[[echo]] " + " ".join(["gamma"] * 1100)}]
    with pytest.raises(ContextTooLong) as caught:
        await agent.run(request)
    assert caught.value.code == "context_length_exceeded"
    kinds = ["summary" if _is_summary_request(c["messages"]) else "turn" for c in llm.calls]
    assert kinds == ["turn", "summary", "turn"]
    assert [o.stage for o, _ in listener.calls] == ["summarized"]


async def test_with_auto_off_a_refusal_is_not_compacted() -> None:
    llm = RecordingLLM()
    agent = Agent(
        "a", model="offline-tiny", llm=llm,
        compaction_policy=CompactionPolicy(window=4096, auto=False),
    )
    with pytest.raises(ContextTooLong):
        await agent.run([*conversation(8), {"role": "user", "content": "hi"}])
    assert len(llm.calls) == 1 and agent.last_compaction is None
