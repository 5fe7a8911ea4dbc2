"""Compaction: policy validation, each stage's exact outcome, and invariants over random conversations."""

from __future__ import annotations

import asyncio
import copy
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from hookbus.services.orchestrator.compaction.rules import (
    SUMMARY_HEADER,
    SUMMARY_INSTRUCTION,
    Compaction,
    CompactionPolicy,
    compact,
    compact_if_needed,
    compact_in_run,
    is_summary,
)
from hookbus.services.orchestrator.compaction.tokens import (
    count_content,
    count_message,
    count_messages,
    count_text,
)
from hookbus.services.orchestrator.compaction.user_quotes import Entry, clip, split_summary

Message = dict[str, Any]
SYSTEM: Message = {"role": "system", "content": "You are a careful coding agent."}
SLACK = 150  # room a summary or a drop note needs next to the messages that must stay
WINDOW = 2_000  # small enough that a dozen short turns need compacting


VOCABULARY = ("alpha", "beta", "gamma", "delta", "file", "value", "result", "check")


def text(words: int, tag: str) -> str:
    """A tagged text of about ``words`` tokens (each word is one token)."""
    return f"[{tag}] " + " ".join(VOCABULARY[i % len(VOCABULARY)] for i in range(words))


def chat_turn(t: int, words: int = 60) -> list[Message]:
    return [
        {"role": "user", "content": f"Question {t}: " + text(words, f"q{t}")},
        {"role": "assistant", "content": f"Answer {t}: " + text(words, f"a{t}")},
    ]


def unquotable_turn(t: int, words: int = 60) -> list[Message]:
    """A turn whose user message holds no text (nothing of the user's to quote)."""
    return [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": f"Answer {t}: " + text(words, f"a{t}")},
    ]


def tool_turn(t: int, output_words: int = 300, rounds: int = 1) -> list[Message]:
    turn: list[Message] = [
        {"role": "user", "content": f"Please read file {t}. " + text(20, f"q{t}")}
    ]
    for r in range(rounds):
        call_id = f"call_{t}_{r}"
        turn.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": "read_file",
                            "arguments": json.dumps({"path": f"src/f{t}_{r}.py"}),
                        },
                    }
                ],
            }
        )
        turn.append(
            {"role": "tool", "tool_call_id": call_id, "content": text(output_words, f"out{t}_{r}")}
        )
    turn.append({"role": "assistant", "content": f"File {t} done. " + text(20, f"a{t}")})
    return turn


class Recorder:
    """A summarizer: a plain async function that remembers what it was asked."""

    def __init__(
        self, answer: str = "The user asked about files; all read.", error: Exception | None = None
    ) -> None:
        self.answer = answer
        self.error = error
        self.requests: list[list[Message]] = []

    async def __call__(self, request: list[Message]) -> str:
        self.requests.append(copy.deepcopy(request))
        if self.error is not None:
            raise self.error
        return self.answer


def summary_parts(message: Message) -> tuple[str, list[Entry]]:
    """A summary message's model-written text and the user's quotes under it."""
    assert is_summary(message)
    return split_summary(message["content"].removeprefix(f"{SUMMARY_HEADER}\n"))


def accounted(entries: list[Entry]) -> int:
    """User messages the quotes stand for: each quote, plus every one counted as left out."""
    return sum(entry if isinstance(entry, int) else 1 for entry in entries)


def run(coroutine: Awaitable[Compaction]) -> Compaction:
    async def wrapper() -> Compaction:
        return await coroutine

    return asyncio.run(wrapper())


def cleared_note(name: str, content: str) -> str:
    return f"[tool output cleared: {name}, {count_content(content)} tokens]"


# ---------------------------------------------------------------- policy


def test_policy_defaults_and_resolution() -> None:
    policy = CompactionPolicy()
    assert (policy.auto, policy.at, policy.keep, policy.hard, policy.clear_tool_results) == (
        True,
        0.8,
        0.25,
        0.95,
        True,
    )
    assert (policy.model, policy.instructions, policy.window) == (None, None, None)
    resolved = policy.resolve(10_000)
    assert (resolved.window, resolved.at, resolved.keep, resolved.hard, resolved.settle) == (
        10_000,
        8_000,
        2_500,
        9_500,
        6_000,
    )


def test_policy_tokens_and_window_override() -> None:
    policy = CompactionPolicy(at=6_000, keep=1_000.0, hard=0.9)
    assert policy.keep == 1_000 and isinstance(policy.keep, int)
    resolved = policy.resolve(10_000)
    assert (resolved.at, resolved.keep, resolved.hard, resolved.settle) == (
        6_000,
        1_000,
        9_000,
        4_500,
    )
    # policy.window wins over the model's window.
    assert CompactionPolicy(window=2_000).resolve(128_000).at == 1_600
    # A token value beyond the window is capped at it.
    assert CompactionPolicy(hard=50_000).resolve(10_000).hard == 10_000


def test_policy_is_frozen() -> None:
    policy = CompactionPolicy()
    with pytest.raises(ValidationError):
        policy.at = 0.5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"threshold": 0.5}, "Extra inputs are not permitted"),
        ({"at": 0}, "at must be > 0"),
        ({"keep": -0.1}, "keep must be > 0"),
        ({"hard": float("nan")}, "hard must be > 0"),
        ({"at": 1500.5}, "at above 1 is a number of tokens and must be a whole number"),
        ({"at": True}, "at must be a number"),
        ({"at": 0.95, "hard": 0.9}, "at (0.95) must be below hard (0.9)"),
        ({"at": 0.9, "hard": 0.9}, "at (0.9) must be below hard (0.9)"),
        ({"keep": 0.8, "at": 0.5}, "keep (0.8) must be below at (0.5)"),
        ({"at": 9000, "hard": 8000}, "at (9000) must be below hard (8000)"),
        ({"window": 0}, "greater than 0"),
        (
            {"window": 10_000, "at": 9_600},
            "at (9600 tokens) must be below hard (9500 tokens) for a 10000-token window",
        ),
    ],
)
def test_policy_refusals(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as failure:
        CompactionPolicy(**fields)
    assert message in str(failure.value)


def test_mixed_kinds_are_checked_against_a_window() -> None:
    policy = CompactionPolicy(at=9_600, keep=2_000)  # fine in itself: hard is a fraction
    with pytest.raises(ValueError, match=r"at \(9600 tokens\) must be below hard \(9500 tokens\)"):
        policy.resolve(10_000)
    assert policy.resolve(100_000).at == 9_600
    with pytest.raises(ValueError, match=r"keep \(3000 tokens\) must be below at \(2400 tokens\)"):
        CompactionPolicy(keep=3_000).resolve(3_000)


# ---------------------------------------------------------------- sentences


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        ({"stage": "none"}, "No compaction needed. Context 12% full."),
        ({"stage": "cleared", "cleared": 3}, "Cleared 3 old tool outputs. Context 12% full."),
        ({"stage": "cleared", "cleared": 1}, "Cleared 1 old tool output. Context 12% full."),
        (
            {"stage": "summarized", "summarized": 14, "kept": 4, "cleared": 2},
            "Compacted the conversation: summarized 14 messages, kept 4, cleared 2 tool outputs. Context 12% full.",
        ),
        (
            {"stage": "summarized", "summarized": 14, "kept": 4},
            "Compacted the conversation: summarized 14 messages, kept 4. Context 12% full.",
        ),
        (
            {"stage": "dropped", "dropped": 3, "reason": "summarizer raised TimeoutError: slow"},
            "Summary failed (summarizer raised TimeoutError: slow); dropped the 3 oldest turns. Context 12% full.",
        ),
        (
            {"stage": "dropped", "dropped": 1, "reason": "summarizer returned an empty summary"},
            "Summary failed (summarizer returned an empty summary); dropped the oldest turn. Context 12% full.",
        ),
        (
            {"stage": "none", "reason": "summarizer raised RuntimeError: x"},
            "Summary failed (summarizer raised RuntimeError: x); nothing was changed. Context 12% full.",
        ),
        (
            {"stage": "none", "reason": "automatic compaction is off"},
            "Nothing compacted: automatic compaction is off. Context 12% full.",
        ),
        (
            {"stage": "summarized", "summarized": 2, "kept": 9, "after": 700},
            "Compacted the conversation: summarized 2 messages, kept 9. Still above the target of 600 tokens. Context 70% full.",
        ),
    ],
)
def test_sentence(fields: dict[str, Any], line: str) -> None:
    values: dict[str, Any] = {
        "messages": [],
        "before": 900,
        "after": 120,
        "window": 1_000,
        "target": 600,
        **fields,
    }
    assert Compaction(**values).sentence() == line


# ---------------------------------------------------------------- between turns


def test_nothing_to_do_below_the_threshold() -> None:
    messages = [SYSTEM, *chat_turn(0)]
    summarize = Recorder()
    outcome = run(compact_if_needed(messages, 10, CompactionPolicy(), 128_000, summarize))
    assert outcome.stage == "none"
    assert outcome.messages == messages
    assert outcome.before == outcome.after == count_messages(messages)
    assert outcome.kept == 2 and outcome.summary is None and outcome.reason is None
    assert outcome.sentence() == "No compaction needed. Context 0% full."
    assert summarize.requests == []


def test_auto_off_leaves_the_conversation_alone() -> None:
    messages = [SYSTEM, *[m for t in range(10) for m in chat_turn(t)]]
    outcome = run(compact_if_needed(messages, 0, CompactionPolicy(auto=False), 1_000, Recorder()))
    assert outcome.stage == "none" and outcome.messages == messages
    assert outcome.reason == "automatic compaction is off"


def test_clearing_old_tool_outputs_comes_first() -> None:
    messages = [SYSTEM, *[m for t in range(6) for m in tool_turn(t)]]
    snapshot = copy.deepcopy(messages)
    policy = CompactionPolicy()
    window = WINDOW
    resolved = policy.resolve(window)
    before = count_messages(messages)
    assert before > resolved.at

    summarize = Recorder()
    outcome = run(compact_if_needed(messages, 100, policy, window, summarize))

    assert messages == snapshot
    assert summarize.requests == []
    assert outcome.stage == "cleared"
    assert outcome.target == resolved.settle - 100
    assert outcome.before == before and outcome.after == count_messages(outcome.messages)
    assert outcome.after <= outcome.target
    tools = [i for i, m in enumerate(messages) if m["role"] == "tool"]
    cleared = tools[: outcome.cleared]
    for i, (original, result) in enumerate(zip(messages, outcome.messages, strict=True)):
        if i in cleared:
            assert result == {**original, "content": cleared_note("read_file", original["content"])}
        else:
            assert result == original
    # Oldest first, and no more than needed: one fewer would not have been enough.
    last = messages[cleared[-1]]
    saved = count_message(last) - count_message(outcome.messages[cleared[-1]])
    assert outcome.after + saved > outcome.target
    assert outcome.kept == len(messages) - 1
    assert (
        outcome.sentence()
        == f"Cleared {outcome.cleared} old tool outputs. Context {round(100 * outcome.after / window)}% full."
    )


def test_summarizing_keeps_the_recent_part_verbatim() -> None:
    messages = [SYSTEM, *[m for t in range(12) for m in chat_turn(t)]]
    snapshot = copy.deepcopy(messages)
    policy = CompactionPolicy(instructions="Keep file paths exact.")
    window = WINDOW
    resolved = policy.resolve(window)
    summarize = Recorder("The user asked twelve questions; all were answered.")

    outcome = run(compact_if_needed(messages, 200, policy, window, summarize))

    assert messages == snapshot
    assert outcome.stage == "summarized"
    kept = outcome.kept
    recent = messages[-kept:]
    assert count_messages(recent) <= resolved.keep < count_messages(messages[-kept - 1 :])
    assert outcome.messages[0] == SYSTEM and outcome.messages[2:] == recent
    summary, quotes = summary_parts(outcome.messages[1])
    assert summary == "The user asked twelve questions; all were answered."
    assert quotes[0] == clip(messages[1]["content"])  # the first question, in the user's words
    assert accounted(quotes) == sum(m["role"] == "user" for m in messages[1:-kept])
    assert outcome.summary == "The user asked twelve questions; all were answered."
    assert outcome.summarized == len(messages) - 1 - kept
    assert outcome.after <= outcome.target == resolved.settle - 200
    assert outcome.sentence() == (
        f"Compacted the conversation: summarized {outcome.summarized} messages, kept {kept}. "
        f"Context {round(100 * outcome.after / window)}% full."
    )

    (request,) = summarize.requests
    system, user = request
    assert system["role"] == "system" and system["content"].startswith(SUMMARY_INSTRUCTION)
    assert "[[" not in system["content"]  # no offline-model directive reaches a real LLM
    assert "Keep file paths exact." in system["content"]
    assert "Focus:" not in system["content"]
    assert user["role"] == "user"
    assert messages[1]["content"] in user["content"]  # the oldest question
    assert messages[-1]["content"] not in user["content"]  # the kept part is not summarized
    assert SYSTEM["content"] not in user["content"]  # the system prompt stays as it is


def test_a_summary_is_rolled_into_the_next_one() -> None:
    window = WINDOW
    policy = CompactionPolicy()
    first = run(
        compact_if_needed(
            [SYSTEM, *[m for t in range(12) for m in chat_turn(t)]],
            200,
            policy,
            window,
            Recorder("FIRST SUMMARY"),
        )
    )
    assert first.stage == "summarized"
    grown = [*first.messages, *[m for t in range(12, 22) for m in chat_turn(t)]]

    summarize = Recorder("SECOND SUMMARY")
    second = run(compact_if_needed(grown, 200, policy, window, summarize))

    assert second.stage == "summarized"
    summaries = [m for m in second.messages if is_summary(m)]
    assert len(summaries) == 1 and summary_parts(summaries[0])[0] == "SECOND SUMMARY"
    assert second.messages[0] == SYSTEM and second.messages[1] == summaries[0]
    assert summary_parts(summaries[0])[1][0] == clip(chat_turn(0)[0]["content"])  # carried over
    transcript = summarize.requests[0][1]["content"]
    assert f"{SUMMARY_HEADER}\nFIRST SUMMARY" in transcript
    assert second.summarized == len(grown) - 1 - second.kept  # the old summary is one of them


def test_a_failed_summary_with_nothing_to_quote_drops_the_oldest_turns() -> None:
    messages = [SYSTEM, *[m for t in range(12) for m in unquotable_turn(t, words=125)]]
    snapshot = copy.deepcopy(messages)
    window = WINDOW
    summarize = Recorder(error=RuntimeError("model unavailable"))

    outcome = run(compact_if_needed(messages, 200, CompactionPolicy(), window, summarize))

    assert messages == snapshot
    assert outcome.stage == "dropped"
    assert outcome.reason == "summarizer raised RuntimeError: model unavailable"
    turns = outcome.dropped
    note = {
        "role": "system",
        "content": f"[{turns} earlier turns were dropped to fit the context window]",
    }
    assert outcome.messages == [SYSTEM, note, *messages[1 + 2 * turns :]]
    assert outcome.after <= outcome.target
    # No more than needed: with one turn fewer dropped it would not fit.
    one_fewer = [
        SYSTEM,
        {
            "role": "system",
            "content": f"[{turns - 1} earlier turns were dropped to fit the context window]",
        },
        *messages[1 + 2 * (turns - 1) :],
    ]
    assert count_messages(one_fewer) > outcome.target
    assert outcome.kept == len(messages) - 1 - 2 * turns
    assert outcome.sentence() == (
        f"Summary failed (summarizer raised RuntimeError: model unavailable); dropped the {turns} oldest turns. "
        f"Context {round(100 * outcome.after / window)}% full."
    )


def test_an_empty_summary_counts_as_a_failure() -> None:
    messages = [SYSTEM, *[m for t in range(12) for m in unquotable_turn(t, words=125)]]
    outcome = run(compact_if_needed(messages, 200, CompactionPolicy(), WINDOW, Recorder("   \n")))
    assert outcome.stage == "dropped"
    assert outcome.reason == "summarizer returned an empty summary"
    assert outcome.summary is None


@pytest.mark.parametrize(
    ("summarize", "reason"),
    [
        (Recorder("   \n"), "summarizer returned an empty summary"),
        (Recorder(error=RuntimeError("model unavailable")), "summarizer raised RuntimeError: model unavailable"),
    ],
    ids=["empty", "raised"],
)
def test_a_failed_summary_keeps_the_users_words_quoted(summarize: Recorder, reason: str) -> None:
    """A model that cannot summarize (a small base model answers nothing usable) must not cost
    the user's first message, which states what they asked: it stays, quoted, instead of being
    dropped with the oldest turns."""
    fact = {"role": "user", "content": "Remember this: my cat is called Pixel and my dog is called Rex."}
    messages = [
        SYSTEM, fact, {"role": "assistant", "content": "Got it."},
        *[m for t in range(1, 12) for m in chat_turn(t)],
    ]
    snapshot = copy.deepcopy(messages)

    outcome = run(compact_if_needed(messages, 200, CompactionPolicy(), WINDOW, summarize))

    assert messages == snapshot
    assert outcome.stage == "summarized" and outcome.dropped == 0
    assert outcome.reason == reason and outcome.summary is None
    assert outcome.after <= outcome.target
    summary = outcome.messages[1]
    model_part, quotes = summary_parts(summary)
    assert model_part == "" and quotes[0] == fact["content"]
    assert accounted(quotes) == outcome.summarized // 2  # every older user message quoted or counted
    assert outcome.messages == [SYSTEM, summary, *messages[1 + outcome.summarized :]]
    assert outcome.sentence() == (
        f"Summary failed ({reason}); replaced {outcome.summarized} messages with the user's own words "
        f"quoted, kept {outcome.kept}. Context {round(100 * outcome.after / WINDOW)}% full."
    )


def test_a_second_drop_merges_the_notes() -> None:
    window = WINDOW
    failing = Recorder(error=RuntimeError("down"))
    first = run(
        compact_if_needed(
            [SYSTEM, *[m for t in range(12) for m in unquotable_turn(t, words=125)]],
            200,
            CompactionPolicy(),
            window,
            failing,
        )
    )
    grown = [*first.messages, *[m for t in range(12, 20) for m in unquotable_turn(t, words=125)]]
    second = run(compact_if_needed(grown, 200, CompactionPolicy(), window, failing))
    assert second.stage == "dropped"
    notes = [m for m in second.messages if m["role"] == "system" and m["content"].startswith("[")]
    assert notes == [
        {
            "role": "system",
            "content": f"[{first.dropped + second.dropped} earlier turns were dropped to fit the context window]",
        }
    ]


def test_an_overlong_summary_is_cut_to_fit() -> None:
    messages = [SYSTEM, *[m for t in range(12) for m in chat_turn(t)]]
    outcome = run(
        compact_if_needed(messages, 200, CompactionPolicy(), WINDOW, Recorder(text(3_000, "s")))
    )
    assert outcome.stage == "summarized"
    assert outcome.after <= outcome.target
    assert outcome.summary is not None and text(3_000, "s").startswith(outcome.summary)
    assert count_text(outcome.summary) <= WINDOW // 10


def test_without_clearing_the_tool_outputs_are_summarized() -> None:
    messages = [SYSTEM, *[m for t in range(6) for m in tool_turn(t)]]
    outcome = run(
        compact_if_needed(
            messages, 100, CompactionPolicy(clear_tool_results=False), WINDOW, Recorder()
        )
    )
    assert outcome.stage == "summarized" and outcome.cleared == 0
    assert all(
        not m.get("content", "") or "cleared" not in str(m["content"]) for m in outcome.messages
    )


def test_the_result_shares_nothing_with_the_input() -> None:
    messages = [SYSTEM, *[m for t in range(3) for m in tool_turn(t, output_words=20)]]
    snapshot = copy.deepcopy(messages)
    outcome = run(compact_if_needed(messages, 0, CompactionPolicy(), 128_000, Recorder()))
    for message in outcome.messages:
        message["content"] = "changed"
        for call in message.get("tool_calls") or ():
            call["function"]["arguments"] = "changed"
    assert messages == snapshot


def test_without_a_system_prompt_the_summary_comes_first() -> None:
    messages = [m for t in range(12) for m in chat_turn(t)]
    outcome = run(compact_if_needed(messages, 200, CompactionPolicy(), WINDOW, Recorder("S")))
    assert outcome.stage == "summarized"
    assert summary_parts(outcome.messages[0]) == ("S", [clip(messages[0]["content"]), 8])
    assert outcome.messages[1:] == messages[-outcome.kept :]


# ---------------------------------------------------------------- the user's own words


FACT = "Remember this: my cat is called Pixel and my dog is called Rex."


async def echo(request: list[Message]) -> str:
    """What a small base model does with a summary request: it repeats the transcript."""
    return str(request[1]["content"])


def quote_tokens(message: Message) -> int:
    """Tokens of the quotes section of a summary message (0 without one)."""
    summary = summary_parts(message)[0]
    return count_text(message["content"]) - count_text(f"{SUMMARY_HEADER}\n{summary}")


@pytest.mark.parametrize("summarize", [Recorder("lorem ipsum dolor sit amet"), echo], ids=["garbage", "echo"])
def test_the_users_words_survive_a_summary_that_lost_them(summarize: Callable[[list[Message]], Awaitable[str]]) -> None:
    messages = [SYSTEM, {"role": "user", "content": FACT}, {"role": "assistant", "content": "Got it."}]
    messages += [m for t in range(12) for m in chat_turn(t)]
    policy = CompactionPolicy()

    outcome = run(compact_if_needed(messages, 200, policy, WINDOW, summarize))

    assert outcome.stage == "summarized" and outcome.after <= outcome.target
    summary, quotes = summary_parts(outcome.messages[1])
    assert "Pixel" not in summary or summarize is echo  # the model's part did not keep it...
    assert quotes[0] == FACT  # ...the quote did, word for word
    assert all(not str(q).startswith(("Got it", "Answer")) for q in quotes)  # assistant text is not quoted
    limit = WINDOW // 10
    assert count_text(outcome.messages[1]["content"].removeprefix(f"{SUMMARY_HEADER}\n")) <= limit
    assert quote_tokens(outcome.messages[1]) <= limit // 2


def test_quotes_are_clipped_and_the_middle_ones_left_out_when_over_budget() -> None:
    messages = [SYSTEM, *[m for t in range(8) for m in tool_turn(t, output_words=40)]]
    messages += [m for t in range(8, 20) for m in chat_turn(t, words=200)]
    policy = CompactionPolicy()
    window = 8_000

    outcome = run(compact_if_needed(messages, 200, policy, window, Recorder("S")))

    assert outcome.stage == "summarized" and outcome.after <= outcome.target
    _, quotes = summary_parts(outcome.messages[1])
    said = [m["content"] for m in messages[1 : 1 + outcome.summarized] if m["role"] == "user"]
    texts = [q for q in quotes if isinstance(q, str)]
    assert texts[0] == clip(said[0]) and texts[-1] == clip(said[-1])  # the first and the latest
    assert len(texts) < len(said) and accounted(quotes) == len(said)  # the rest are counted
    assert [q for q in quotes if isinstance(q, int)] == [len(said) - len(texts)]  # one line, in the middle
    assert all(count_text(q) <= 48 for q in texts)
    assert any(q.endswith("…") for q in texts) and not any("[out" in q for q in texts)  # no tool output
    assert quote_tokens(outcome.messages[1]) <= (window // 10) // 2


def test_repeated_compaction_keeps_the_first_words_and_does_not_grow_the_quotes() -> None:
    policy = CompactionPolicy()
    conversation = [SYSTEM, {"role": "user", "content": FACT}, {"role": "assistant", "content": "Got it."}]
    sizes = []
    users = 1
    for round_ in range(6):
        turns = [m for t in range(12 * round_, 12 * round_ + 12) for m in chat_turn(t)]
        users += 12
        outcome = run(compact_if_needed([*conversation, *turns], 200, policy, WINDOW, echo))
        assert outcome.stage == "summarized" and outcome.after <= outcome.target
        summary = outcome.messages[1]
        _, quotes = summary_parts(summary)
        assert quotes[0] == FACT
        assert not any(str(q).startswith(SUMMARY_HEADER) for q in quotes)  # a summary is not quoted
        kept_users = sum(m["role"] == "user" for m in outcome.messages[2:])
        assert accounted(quotes) == users - kept_users
        sizes.append(quote_tokens(summary))
        conversation = outcome.messages
    assert max(sizes) <= (WINDOW // 10) // 2
    assert sizes[-1] <= sizes[1]  # the same budget every time: no growth


def test_a_quote_is_one_line_of_at_most_48_tokens_whatever_the_message() -> None:
    assert clip("  two\n\nlines  ") == "two lines"
    pasted = clip("word " * 50_000)  # a pasted file: read from its start only
    assert pasted.endswith("…") and count_text(pasted) <= 48 and pasted.startswith("word word")
    assert clip("x" * 2_000).endswith("…")  # few words, many tokens


# ---------------------------------------------------------------- on request


def test_compact_keeps_the_latest_exchange_and_passes_the_focus() -> None:
    messages = [SYSTEM, *tool_turn(0), *chat_turn(1), *tool_turn(2, rounds=2)]
    snapshot = copy.deepcopy(messages)
    summarize = Recorder("Earlier: read file 0, discussed question 1.")
    policy = CompactionPolicy(instructions="Mention every file path.")

    outcome = run(compact(messages, policy, 128_000, summarize, focus="the failing migration"))

    assert messages == snapshot
    exchange = tool_turn(2, rounds=2)
    assert outcome.stage == "summarized"
    assert outcome.messages[0] == SYSTEM and outcome.messages[2:] == exchange
    assert summary_parts(outcome.messages[1]) == (
        "Earlier: read file 0, discussed question 1.",
        [clip(messages[1]["content"]), clip(messages[5]["content"])],  # the user's two requests
    )
    assert outcome.summarized == len(messages) - 1 - len(exchange)
    assert outcome.kept == len(exchange)
    assert outcome.focus == "the failing migration"
    system = summarize.requests[0][0]["content"]
    assert "\nFocus: the failing migration" in system
    assert "Mention every file path." in system
    transcript = summarize.requests[0][1]["content"]
    assert 'read_file({"path": "src/f0_0.py"})' in transcript
    assert "[tool result: read_file]" in transcript


def test_compact_with_nothing_before_the_latest_exchange() -> None:
    messages = [SYSTEM, *tool_turn(0)]
    summarize = Recorder()
    outcome = run(compact(messages, CompactionPolicy(), 128_000, summarize))
    assert outcome.stage == "none" and outcome.messages == messages
    assert summarize.requests == []


def test_compact_failing_on_a_small_conversation_changes_nothing() -> None:
    messages = [SYSTEM, *chat_turn(0), *chat_turn(1)]
    outcome = run(
        compact(messages, CompactionPolicy(), 128_000, Recorder(error=TimeoutError("slow")))
    )
    assert outcome.stage == "none" and outcome.messages == messages
    assert outcome.reason == "summarizer raised TimeoutError: slow"
    percent = round(100 * outcome.after / 128_000)
    assert (
        outcome.sentence()
        == f"Summary failed (summarizer raised TimeoutError: slow); nothing was changed. Context {percent}% full."
    )


def test_compact_shortens_huge_tool_outputs_for_the_summarizer() -> None:
    messages = [SYSTEM, *tool_turn(0, output_words=5_000), *chat_turn(1)]
    summarize = Recorder()
    run(compact(messages, CompactionPolicy(), 128_000, summarize))
    transcript = summarize.requests[0][1]["content"]
    assert "characters left out" in transcript
    assert len(transcript) < 12_000


# ---------------------------------------------------------------- inside a turn


def test_in_run_does_nothing_below_hard() -> None:
    messages = [SYSTEM, *[m for t in range(12) for m in chat_turn(t)]]
    policy = CompactionPolicy()
    window = 8_000
    assert count_messages(messages) <= policy.resolve(window).hard
    outcome = run(
        compact_in_run(messages, policy, window, Recorder(), turn_start=len(messages) - 2)
    )
    assert outcome.stage == "none" and outcome.messages == messages


def test_in_run_stop_leaves_the_current_turn_whole() -> None:
    older = [m for t in range(10) for m in chat_turn(t)]
    turn = tool_turn(10, output_words=40, rounds=3)[:-1]  # still working: ends with a tool result
    messages = [SYSTEM, *older, *turn]
    policy = CompactionPolicy()
    window = 1_600
    assert count_messages(messages) > policy.resolve(window).hard
    summarize = Recorder("Ten questions answered.")

    outcome = run(compact_in_run(messages, policy, window, summarize, turn_start=1 + len(older)))

    assert outcome.stage == "summarized"
    assert outcome.messages[-len(turn) :] == turn
    assert outcome.messages[0] == SYSTEM
    assert summary_parts(outcome.messages[1])[0] == "Ten questions answered."
    assert outcome.after <= outcome.target == policy.resolve(window).settle
    assert turn[0]["content"] not in summarize.requests[0][1]["content"]


def test_in_run_clears_inside_the_turn_only_when_the_turn_alone_is_too_big() -> None:
    turn = tool_turn(0, output_words=250, rounds=5)[:-1]
    messages = [SYSTEM, *turn]
    policy = CompactionPolicy()
    window = 1_200
    assert count_messages(messages) > policy.resolve(window).hard

    outcome = run(compact_in_run(messages, policy, window, Recorder(), turn_start=1))

    assert outcome.stage == "cleared"
    assert outcome.after <= outcome.target
    assert outcome.messages[:2] == messages[:2]  # system prompt, user message
    assert outcome.messages[-2:] == messages[-2:]  # the latest tool round
    for original, result in zip(messages, outcome.messages, strict=True):
        if result != original:
            assert original["role"] == "tool"
            assert result["content"] == cleared_note("read_file", original["content"])


# ---------------------------------------------------------------- properties


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    """Random conversations: a system prompt or not, turns with tool rounds of mixed sizes."""
    sizes = st.sampled_from([2, 15, 60, 250])
    outputs = st.sampled_from([15, 250, 700])
    messages: list[Message] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": text(draw(sizes), "sys")})
    turns = draw(st.integers(1, 7))
    for t in range(turns):
        messages.append({"role": "user", "content": text(draw(sizes), f"u{t}")})
        for r in range(draw(st.integers(0, 3))):
            ids = [f"c{t}_{r}_{k}" for k in range(draw(st.integers(1, 3)))]
            messages.append(
                {
                    "role": "assistant",
                    "content": draw(st.none() | st.just(text(5, f"pre{t}_{r}"))),
                    "tool_calls": [
                        {
                            "id": i,
                            "type": "function",
                            "function": {
                                "name": f"tool_{i[-1]}",
                                "arguments": json.dumps({"id": i}),
                            },
                        }
                        for i in ids
                    ],
                }
            )
            messages.extend(
                {"role": "tool", "tool_call_id": i, "content": text(draw(outputs), f"o{i}")}
                for i in ids
            )
        if t < turns - 1 or draw(st.booleans()):
            messages.append({"role": "assistant", "content": text(draw(sizes), f"a{t}")})
    return messages


@st.composite
def policies(draw: st.DrawFn) -> CompactionPolicy:
    at = draw(st.sampled_from([0.3, 0.5, 0.7, 0.8, 0.9]))
    return CompactionPolicy(
        at=at,
        hard=draw(st.sampled_from([h for h in (0.6, 0.85, 0.95, 1.0) if h > at])),
        keep=draw(st.sampled_from([k for k in (0.05, 0.1, 0.25, 0.4) if k < at])),
        clear_tool_results=draw(st.booleans()),
    )


Summarize = Callable[[list[Message]], Awaitable[str]]


def summarizers() -> st.SearchStrategy[Summarize]:
    def make(kind: str) -> Summarize:
        async def summarize(request: list[Message]) -> str:
            assert SUMMARY_INSTRUCTION in request[0]["content"]
            if kind == "raise":
                raise ConnectionError("no route")
            return {"short": "A short summary.", "long": text(2_000, "long"), "empty": ""}[kind]

        return summarize

    return st.sampled_from(["short", "short", "long", "raise", "empty"]).map(make)


def head_of(messages: list[Message]) -> list[Message]:
    return messages[:1] if messages and messages[0]["role"] == "system" else []


def last_unit(messages: list[Message]) -> list[Message]:
    """The last message with the assistant call it answers (they are kept together)."""
    last = messages[-1]
    if last["role"] != "tool":
        return [last]
    start = max(
        i
        for i, m in enumerate(messages)
        if any(c["id"] == last["tool_call_id"] for c in m.get("tool_calls") or ())
    )
    return messages[start:]


def is_note(message: Message) -> bool:
    return (
        message["role"] == "system"
        and str(message["content"]).startswith("[")
        and "dropped to fit" in message["content"]
    )


def check_invariants(messages: list[Message], snapshot: list[Message], outcome: Compaction) -> None:
    event(f"stage {outcome.stage}")
    assert messages == snapshot, "the input was changed"
    out = outcome.messages
    head = head_of(messages)
    assert out[: len(head)] == head, "the system prompt moved or changed"
    assert out[-1] == messages[-1], "the last message was not kept"
    assert outcome.before == count_messages(messages)
    assert outcome.after == count_messages(out)

    made = [i for i, m in enumerate(out) if is_summary(m) or is_note(m)]
    assert made == list(range(len(head), len(head) + len(made))) and len(made) <= 2
    assert sum(is_summary(m) for m in out) <= 1

    # Every other message is an input message, in order, unchanged or a cleared tool output.
    originals = iter(messages)
    for message in out[len(head) + len(made) :]:
        for original in originals:
            if original == message:
                break
            if (
                original["role"] == "tool" == message["role"]
                and original["tool_call_id"] == message["tool_call_id"]
                and message["content"].startswith("[tool output cleared: ")
            ):
                break
        else:
            raise AssertionError(f"{message} is not from the input")

    # A tool call and its results stay together.
    answers_in = {m["tool_call_id"] for m in messages if m["role"] == "tool"}
    seen_calls: set[str] = set()
    for message in out:
        calls = {c["id"] for c in message.get("tool_calls") or ()}
        seen_calls |= calls
        if message["role"] == "tool":
            assert message["tool_call_id"] in seen_calls, "a tool result lost its call"
    answered_out = {m["tool_call_id"] for m in out if m["role"] == "tool"}
    assert {c for c in seen_calls if c in answers_in} == answered_out, "a tool call lost its result"


SETTINGS = settings(
    max_examples=int(os.environ.get("COMPACTION_EXAMPLES", "150")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(conversations(), policies(), st.integers(400, 12_000), st.integers(0, 300), summarizers())
def test_between_turns_invariants(
    messages: list[Message],
    policy: CompactionPolicy,
    window: int,
    incoming: int,
    summarize: Summarize,
) -> None:
    snapshot = copy.deepcopy(messages)
    resolved = policy.resolve(window)
    outcome = run(compact_if_needed(messages, incoming, policy, window, summarize))
    check_invariants(messages, snapshot, outcome)
    if outcome.before + incoming <= resolved.at:
        assert outcome.stage == "none" and outcome.messages == messages
        return
    target = max(0, resolved.settle - incoming)
    assert outcome.target == target
    if count_messages(head_of(messages)) + count_messages(last_unit(messages)) + SLACK <= target:
        event("target reachable")
        assert outcome.after <= target, outcome.sentence()
    if outcome.stage == "summarized":
        recent = outcome.messages[len(head_of(messages)) + 1 :]
        assert recent == messages[-len(recent) :]
        assert count_messages(recent) <= max(resolved.keep, count_messages(last_unit(messages)))


@SETTINGS
@given(
    conversations(),
    policies(),
    st.integers(400, 12_000),
    summarizers(),
    st.none() | st.just("the tests"),
)
def test_on_request_invariants(
    messages: list[Message],
    policy: CompactionPolicy,
    window: int,
    summarize: Summarize,
    focus: str | None,
) -> None:
    snapshot = copy.deepcopy(messages)
    outcome = run(compact(messages, policy, window, summarize, focus=focus))
    check_invariants(messages, snapshot, outcome)
    latest = max(i for i, m in enumerate(messages) if m["role"] == "user")
    assert outcome.messages[-(len(messages) - latest) :] == messages[latest:]
    if outcome.stage == "summarized":
        head = head_of(messages)
        assert outcome.messages[: len(head)] == head and is_summary(outcome.messages[len(head)])
        assert outcome.messages[len(head) + 1 :] == messages[latest:]


@SETTINGS
@given(conversations(), policies(), st.integers(400, 12_000), summarizers(), st.data())
def test_in_run_invariants(
    messages: list[Message],
    policy: CompactionPolicy,
    window: int,
    summarize: Summarize,
    data: st.DataObject,
) -> None:
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    turn_start = data.draw(st.sampled_from(users))
    turn = messages[turn_start:]
    snapshot = copy.deepcopy(messages)
    resolved = policy.resolve(window)
    outcome = run(compact_in_run(messages, policy, window, summarize, turn_start))
    check_invariants(messages, snapshot, outcome)
    if outcome.before <= resolved.hard:
        assert outcome.stage == "none" and outcome.messages == messages
        return
    in_turn = outcome.messages[-len(turn) :]
    rounds = [i for i, m in enumerate(turn) if m.get("tool_calls")]
    latest_round = rounds[-1] if rounds else len(turn) - 1
    for i, (original, result) in enumerate(zip(turn, in_turn, strict=True)):
        if i >= latest_round or original["role"] != "tool":
            assert result == original, "the turn was changed outside its old tool outputs"
    if count_messages(head_of(messages)) + count_messages(turn) + SLACK <= resolved.settle:
        event("target reachable with the turn whole")
        assert in_turn == turn
        assert outcome.after <= resolved.settle, outcome.sentence()
