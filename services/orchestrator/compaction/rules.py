"""Context compaction: keep a conversation inside the model's context window.

Pure logic: no Redis, no agent loop. The one LLM call compaction needs, the
summary, is a parameter (:data:`Summarizer`), so the agent decides how it is
made (which model, no hooks) and tests pass a plain async function.

Three entry points, all returning a :class:`Compaction` and never changing
the messages they are given:

* :func:`compact_if_needed`, between turns: compacts when the conversation
  plus the next message would pass ``policy.at``.
* :func:`compact`, on request: everything before the latest exchange becomes
  one summary, whatever the size.
* :func:`compact_in_run`, inside a turn: a safety stop when the conversation
  passes ``policy.hard``; the current turn is left whole whenever possible.

Steps, cheapest first, stopping as soon as the conversation is down to the
target (``settle`` = 0.75 x ``at``, so the next turn does not compact again):

1. *cleared*: large tool outputs outside the recent part become a short
   note naming the tool and the output's size. The call stays, so the model
   knows what it did and can run it again.
2. *summarized*: one summarize call turns everything before the recent part
   (including an earlier summary, which is rolled in) into one ``system``
   message right after the system prompt. Under the model's summary it quotes
   the user's own messages from that part, bounded
   (hookbus.services.orchestrator.compaction.user_quotes): a model that summarizes badly
   cannot lose what the user asked. When the summary fails (the call raises or answers
   nothing usable), the message holds the quotes alone.
3. *dropped*: when the summary fails and there is nothing of the user's to quote, the
   oldest whole turns are dropped until the rest fits, and a system note says how many.

What always holds: the system prompt stays first and unchanged; an assistant
message with tool calls stays together with the tool messages answering it;
the last message is kept; the recent part kept verbatim holds at most
``keep`` tokens, unless the last message (or, for :func:`compact`, the
latest exchange; for :func:`compact_in_run`, the current turn) alone is
larger.
"""

from __future__ import annotations

import bisect
import copy
import itertools
import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from hookbus.services.orchestrator.compaction import user_quotes
from hookbus.services.orchestrator.compaction.tokens import (
    count_content,
    count_message,
    count_messages,
    count_text,
    truncate_text,
)
from hookbus.services.process.offload import is_large, off_loop_async, on_this_loop
from hookbus.skills.compaction_outcome import AUTO_OFF, Compaction, Stage

Message = dict[str, Any]

Summarizer = Callable[[list[Message]], Awaitable[str]]
"""``async def summarize(request_messages) -> str``: one LLM call, no hooks.

It gets the chat messages to send (a system message with the instructions,
beginning with :data:`SUMMARY_INSTRUCTION`, and a user message holding the
transcript) and returns the summary text. The caller picks the model
(``policy.model`` or the agent's own). Raising, or returning an empty text,
counts as a failed summary: the summary message then holds the user's quoted
messages alone, or, with none to quote, the oldest turns are dropped instead.
"""

SUMMARY_HEADER = "Summary of the earlier conversation:"
SUMMARY_INSTRUCTION = "You compact a conversation between a user and an AI assistant."
"""How the summary request's system prompt begins (a real model reads it as the task; the
offline stand-in model recognises a summary request by it)."""
TRANSCRIPT_CUT = "\n\n[the rest of the transcript was cut to fit the context window]"
SUMMARY_REQUEST_OVERHEAD = 32
"""Tokens of a summary request beyond its two texts: message framing, the user line's header."""
SETTLE = 0.75
"""After compacting, the conversation is at most this share of ``at``."""
CLEAR_MIN_TOKENS = 200
"""Tool outputs at most this large are not worth clearing: the note saves little."""

_SUMMARY_FLOOR = 100
"""Fewest tokens a summary is allowed, even when the kept part leaves less room."""
_SUMMARY_RESERVE = 128
"""Tokens the kept part leaves free for the summary message (floor + header + margin)."""
_SUMMARY_SHARE = 10
"""A summary gets at most 1/10 of the window, to stay a summary."""
_MARGIN = 2
_TRANSCRIPT_TOOL_CHARS = 8_000
"""A tool output longer than this is shown to the summarizer with its middle cut out,
so one huge output cannot push the summary request past the summarizer's window."""
_DROP_NOTE = re.compile(
    r"^\[(\d+) earlier turns? (?:was|were) dropped to fit the context window\]$"
)
_ORDER: dict[Stage, int] = {"none": 0, "cleared": 1, "summarized": 2, "dropped": 3}


# ---------------------------------------------------------------- policy


@dataclass(frozen=True, slots=True)
class ResolvedPolicy:
    """A policy's thresholds in tokens for one context window."""

    window: int
    at: int
    keep: int
    hard: int
    settle: int


class CompactionPolicy(BaseModel):
    """When and how to compact. Replaced as a whole, never changed in place.

    ``at``, ``keep`` and ``hard`` are fractions of the context window when
    <= 1, and token counts (whole numbers) when > 1. ``window``, when set,
    wins over the model's window passed to :meth:`resolve`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    auto: bool = True
    at: float = 0.8
    keep: float = 0.25
    hard: float = 0.95
    clear_tool_results: bool = True
    model: str | None = None
    instructions: str | None = None
    window: int | None = Field(default=None, gt=0)

    @field_validator("at", "keep", "hard", mode="before")
    @classmethod
    def _no_bool(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool):
            raise ValueError(f"{info.field_name} must be a number, not {value}")
        return value

    @field_validator("at", "keep", "hard")
    @classmethod
    def _amount(cls, value: float, info: ValidationInfo) -> float:
        name = info.field_name
        if not math.isfinite(value) or value <= 0:
            raise ValueError(
                f"{name} must be > 0: a fraction of the window (<= 1) or a number of tokens (> 1); got {value}"
            )
        if value > 1:
            if not float(value).is_integer():
                raise ValueError(
                    f"{name} above 1 is a number of tokens and must be a whole number; got {value}"
                )
            return int(value)
        return value

    @model_validator(mode="after")
    def _ordered(self) -> CompactionPolicy:
        # Fractions compare with fractions and tokens with tokens right away; a
        # mix can only be compared against a window, so that waits for resolve().
        for low, high in (("keep", "at"), ("at", "hard")):
            a, b = getattr(self, low), getattr(self, high)
            if (a > 1) == (b > 1) and a >= b:
                raise ValueError(f"{low} ({a}) must be below {high} ({b})")
        if self.window is not None:
            self.resolve(self.window)
        return self

    def resolve(self, window: int | None = None) -> ResolvedPolicy:
        """Thresholds in tokens for ``window`` (``self.window`` wins when set).

        Token values above the window are capped at the window. Raises
        ValueError when the resolved values are not ordered keep < at < hard.
        """
        size = self.window or window
        if not size or size <= 0:
            raise ValueError(
                "compaction needs a context window size (policy.window or the model's)"
            )
        at, keep, hard = (_tokens(value, size) for value in (self.at, self.keep, self.hard))
        if at >= hard:
            raise ValueError(
                f"at ({at} tokens) must be below hard ({hard} tokens) for a {size}-token window"
            )
        if keep >= at:
            raise ValueError(
                f"keep ({keep} tokens) must be below at ({at} tokens) for a {size}-token window"
            )
        return ResolvedPolicy(window=size, at=at, keep=keep, hard=hard, settle=int(at * SETTLE))


def _tokens(value: float, window: int) -> int:
    return min(int(value) if value > 1 else int(value * window), window)


# ---------------------------------------------------------------- outcome


# ---------------------------------------------------------------- entry points


async def compact_if_needed(
    messages: Sequence[Mapping[str, Any]],
    incoming_tokens: int,
    policy: CompactionPolicy,
    window: int,
    summarize: Summarizer,
) -> Compaction:
    """Between turns: compact when the conversation plus the next message passes ``at``.

    The target leaves room for the incoming message: afterwards the
    conversation plus ``incoming_tokens`` is at most ``settle`` when possible.
    """
    resolved = policy.resolve(window)
    before = count_messages(messages)
    incoming = max(0, incoming_tokens)
    run = _Run.of(messages, resolved, target=max(0, resolved.settle - incoming))
    if before + incoming <= resolved.at:
        return run.result(before)
    if not policy.auto:
        run.reason = AUTO_OFF
        return run.result(before)
    start = _keep_start(run, run.last_unit(), _keep_budget(run))
    await _reduce_older(run, start, before, policy, summarize)
    return run.result(before)


async def compact(
    messages: Sequence[Mapping[str, Any]],
    policy: CompactionPolicy,
    window: int,
    summarize: Summarizer,
    focus: str | None = None,
) -> Compaction:
    """On request: summarize everything before the latest exchange, whatever the size.

    The latest exchange (from the last user message on) is kept verbatim;
    ``focus`` tells the summarizer what matters most. Tool outputs are not
    cleared first: the summarizer sees them (long ones shortened).
    """
    resolved = policy.resolve(window)
    before = count_messages(messages)
    run = _Run.of(messages, resolved, target=resolved.settle)
    await _reduce_older(
        run, _latest_exchange(run), before, policy, summarize, focus=focus, force=True
    )
    return run.result(before, focus=focus)


async def compact_in_run(
    messages: Sequence[Mapping[str, Any]],
    policy: CompactionPolicy,
    window: int,
    summarize: Summarizer,
    turn_start: int,
) -> Compaction:
    """Inside a turn: a safety stop once the conversation passes ``hard``.

    ``messages[turn_start:]`` is the current turn (from its user message on).
    Only what came before it is cleared, summarized or dropped. If the turn
    alone is still above the target, old tool outputs inside the turn are
    cleared, oldest first, except those of the most recent tool round (the
    model is working with them). With ``auto`` off this does nothing either.

    A long conversation is compacted off the event loop (its copying and counting are
    CPU work); the summarizer still runs on the caller's loop.
    """
    if not is_large(messages):
        return await _compact_in_run(messages, policy, window, summarize, turn_start)
    return await off_loop_async(
        True, _compact_in_run, messages, policy, window, on_this_loop(summarize), turn_start
    )


async def _compact_in_run(
    messages: Sequence[Mapping[str, Any]],
    policy: CompactionPolicy,
    window: int,
    summarize: Summarizer,
    turn_start: int,
) -> Compaction:
    resolved = policy.resolve(window)
    before = count_messages(messages)
    run = _Run.of(messages, resolved, target=resolved.settle)
    if before <= resolved.hard:
        return run.result(before)
    if not policy.auto:
        run.reason = AUTO_OFF
        return run.result(before)
    turn = _turn_index(run, turn_start)
    turn_length = len(run.body) - turn
    start = _keep_start(run, turn, _keep_budget(run))
    total = await _reduce_older(run, start, before, policy, summarize)
    if total > run.target and policy.clear_tool_results:
        _clear_turn(run, len(run.body) - turn_length, total)
    return run.result(before)


def summary_request(
    messages: Sequence[Mapping[str, Any]],
    *,
    limit: int,
    instructions: str | None = None,
    focus: str | None = None,
    window: int | None = None,
) -> list[Message]:
    """The chat messages that ask for a summary of ``messages`` in at most ``limit`` tokens.

    With ``window``, the transcript is cut (its end dropped, with a note) so that the request
    and the ``limit`` tokens of answer fit in it: the summary call must not itself be refused
    as too long."""
    lines = [
        f"{SUMMARY_INSTRUCTION} The assistant will continue from your summary alone, without "
        "the original messages, so keep everything needed to go on:",
        "- what the user asked for, with every constraint and preference they stated;",
        "- what was decided, and why;",
        "- what was done: tools called and what they returned, files, commands, results;",
        "- what is still open or was about to happen next;",
        "- exact names, identifiers, paths, numbers and values.",
        "If the transcript starts with an earlier summary, fold it in: yours replaces it.",
        f"Write plain text without a preamble, at most {limit} tokens.",
    ]
    if instructions and instructions.strip():
        lines += ["", instructions.strip()]
    if focus and focus.strip():
        lines += ["", f"Focus: {focus.strip()}"]
    names = _tool_names(messages)
    transcript = "\n\n".join(_transcript_entry(m, names) for m in messages)
    system = "\n".join(lines)
    if window is not None:
        room = window - limit - count_text(system) - SUMMARY_REQUEST_OVERHEAD
        if count_text(transcript) > room:
            transcript = truncate_text(transcript, max(0, room - count_text(TRANSCRIPT_CUT))) + TRANSCRIPT_CUT
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Conversation to summarize:\n\n{transcript}"},
    ]


def is_summary(message: Mapping[str, Any]) -> bool:
    """True for a summary message this module made (recognized by its header)."""
    content = message.get("content")
    return (
        message.get("role") == "system"
        and isinstance(content, str)
        and content.startswith(SUMMARY_HEADER)
    )


# ---------------------------------------------------------------- one compaction


@dataclass
class _Run:
    """One compaction in progress: a private deep copy of the conversation and a record of
    what was done to it. The caller's messages are never touched after the copy."""

    head: list[Message]
    body: list[Message]
    resolved: ResolvedPolicy
    target: int
    cuttable: list[bool] = field(init=False)
    size: int = field(init=False)
    stage: Stage = "none"
    summary: str | None = None
    summarized: int = 0
    cleared: int = 0
    dropped: int = 0
    dropped_messages: int = 0
    reason: str | None = None

    def __post_init__(self) -> None:
        self.cuttable = _cut_points(self.body)
        self.size = len(self.body)

    @classmethod
    def of(
        cls, messages: Sequence[Mapping[str, Any]], resolved: ResolvedPolicy, target: int
    ) -> _Run:
        copied: list[Message] = copy.deepcopy([dict(m) for m in messages])
        has_prompt = bool(copied) and copied[0].get("role") == "system" and not _is_meta(copied[0])
        split = 1 if has_prompt else 0
        return cls(head=copied[:split], body=copied[split:], resolved=resolved, target=target)

    def reach(self, stage: Stage) -> None:
        """Record a step; the stage reported is the most drastic step taken."""
        if _ORDER[stage] > _ORDER[self.stage]:
            self.stage = stage

    def total(self) -> int:
        return count_messages(self.head) + count_messages(self.body)

    def last_unit(self) -> int:
        """Where the last unsplittable group of messages (the last message and its tool call) starts."""
        return max((k for k in range(len(self.body)) if self.cuttable[k]), default=0)

    def result(self, before: int, focus: str | None = None) -> Compaction:
        messages = self.head + self.body
        return Compaction(
            stage=self.stage,
            messages=messages,
            before=before,
            after=count_messages(messages),
            window=self.resolved.window,
            target=self.target,
            summary=self.summary,
            summarized=self.summarized,
            kept=self.size - self.summarized - self.dropped_messages,
            cleared=self.cleared,
            dropped=self.dropped,
            reason=self.reason,
            focus=focus,
        )


async def _reduce_older(
    run: _Run,
    start: int,
    total: int,
    policy: CompactionPolicy,
    summarize: Summarizer,
    *,
    focus: str | None = None,
    force: bool = False,
) -> int:
    """Shrink ``run.body[:start]`` (the part before the recent one) toward the target.

    Clears first unless forced, then summarizes, then drops when the summary
    fails. Returns the conversation's new token count.
    """
    if policy.clear_tool_results and not force:
        total = _clear(run, 0, start, total)
    if total <= run.target and not force:
        return total
    older = run.body[:start]
    limit = _summary_limit(run, start)
    if not older or not (force or _worth_summarizing(older, limit)):
        return total
    # quoting alone is for a conversation that must shrink: one that fits loses nothing instead
    if not await _summarize(
        run, start, limit, summarize, policy.instructions, focus, quote_alone=total > run.target
    ):
        _drop_oldest(run, start)
    return run.total()


def _keep_budget(run: _Run) -> int:
    """Most tokens the verbatim recent part may hold: ``keep``, and room left for a summary."""
    room = run.target - count_messages(run.head) - _SUMMARY_RESERVE
    return max(0, min(run.resolved.keep, room))


def _keep_start(run: _Run, latest: int, budget: int) -> int:
    """Earliest split point <= ``latest`` whose suffix fits ``budget``; ``latest`` if none does."""
    start = latest
    suffix = count_messages(run.body[latest:])
    for k in range(latest - 1, -1, -1):
        suffix += count_message(run.body[k])
        if suffix > budget:
            break
        if run.cuttable[k]:
            start = k
    return start


def _latest_exchange(run: _Run) -> int:
    """Where the latest exchange starts: the last user message, else the last unit."""
    users = (k for k in range(len(run.body) - 1, -1, -1) if run.body[k].get("role") == "user")
    return next((k for k in users if run.cuttable[k]), run.last_unit())


def _turn_index(run: _Run, turn_start: int) -> int:
    """``turn_start`` as a body index, moved back to a split point and never past the last unit."""
    k = min(max(turn_start - len(run.head), 0), run.last_unit())
    while not run.cuttable[k]:
        k -= 1
    return k


# ---------------------------------------------------------------- steps


def _clear(run: _Run, lo: int, hi: int, total: int) -> int:
    """Replace large tool outputs in ``run.body[lo:hi]``, oldest first, until the total fits."""
    names = _tool_names(run.body)
    for i in range(lo, hi):
        if total <= run.target:
            break
        message = run.body[i]
        if message.get("role") != "tool":
            continue
        size = count_content(message.get("content"))
        if size <= CLEAR_MIN_TOKENS:
            continue
        name = names.get(message.get("tool_call_id")) or message.get("name") or "unknown tool"
        cleared = {**message, "content": f"[tool output cleared: {name}, {size} tokens]"}
        total += count_message(cleared) - count_message(message)
        run.body[i] = cleared
        run.cleared += 1
        run.reach("cleared")
    return total


def _clear_turn(run: _Run, lo: int, total: int) -> None:
    """Clear old tool outputs of the current turn (from ``lo``), sparing the latest tool round."""
    rounds = [i for i in range(lo, len(run.body)) if run.body[i].get("tool_calls")]
    _clear(run, lo, rounds[-1] if rounds else len(run.body) - 1, total)


def _summary_limit(run: _Run, start: int) -> int:
    """Tokens the summary text may take so that the result lands under the target.

    At most a tenth of the window, so a summary stays one; at least a floor,
    so a summary is still useful when the kept part leaves no room (the
    result then honestly stays above the target).
    """
    frame = count_message(_summary_message(""))
    room = (
        run.target - count_messages(run.head) - count_messages(run.body[start:]) - frame - _MARGIN
    )
    return max(_SUMMARY_FLOOR, min(room, run.resolved.window // _SUMMARY_SHARE))


def _worth_summarizing(older: list[Message], limit: int) -> bool:
    """Anything besides earlier summaries and notes, or those too large: else a call gains nothing."""
    return any(not _is_meta(m) for m in older) or count_messages(older) > limit


async def _summarize(
    run: _Run,
    start: int,
    limit: int,
    summarize: Summarizer,
    instructions: str | None,
    focus: str | None,
    quote_alone: bool,
) -> bool:
    """Turn ``run.body[:start]`` into one summary message; False when the summary failed
    (``run.reason`` says how) and the user's words are not to stand alone (``quote_alone``
    False, or nothing of theirs to quote).

    The message holds the model's summary and, after it, the user's own earlier messages
    quoted (hookbus.services.orchestrator.compaction.user_quotes), all within ``limit`` tokens: the
    model's part gets what the quotes leave, and the quotes stand alone when it failed."""
    quotes = user_quotes.quote_block(_user_entries(run.body[:start]), limit)
    own_limit = limit - count_text(quotes)
    # the request still leaves the room of the whole summary free: the margin that makes a
    # count a few percent off the model's (calibrated, not exact) still fit its window
    request = summary_request(
        run.body[:start], limit=own_limit, instructions=instructions, focus=focus,
        window=run.resolved.window - count_text(quotes),
    )
    text = ""
    try:
        answer = await summarize(request)
    except Exception as exc:  # whatever the LLM call did wrong, the quotes or dropping turns are the fallback
        run.reason = f"summarizer raised {type(exc).__name__}: {exc}"
    else:
        text = user_quotes.without_quotes(answer.strip()) if isinstance(answer, str) else ""
        if not text:
            run.reason = "summarizer returned an empty summary"
    if not text and not (quote_alone and quotes):
        return False
    # No model summary but the user's words to quote: they stand for the older part alone,
    # since dropping turns would lose the oldest (the task itself) for good.
    summary = truncate_text(text, own_limit)
    while summary and count_text(summary + quotes) > limit:  # joined texts can count one more
        summary = truncate_text(summary, count_text(summary) - 1)
    run.summary = summary or None
    run.body = [_summary_message(summary + quotes), *run.body[start:]]
    run.summarized = start
    run.reach("summarized")
    return True


def _user_entries(older: Sequence[Mapping[str, Any]]) -> list[user_quotes.Entry]:
    """What the user said in ``older``, oldest first: their messages clipped, and the quotes an
    earlier summary carries (a summary is a system message, so it is never quoted itself)."""
    entries: list[user_quotes.Entry] = []
    for message in older:
        if is_summary(message):
            entries += user_quotes.split_summary(message["content"])[1]
        elif message.get("role") == "user":
            quote = user_quotes.clip(_plain_text(message.get("content")))
            if quote:
                entries.append(quote)
    return entries


def _drop_oldest(run: _Run, start: int) -> None:
    """Drop the oldest whole turns before ``start`` until the conversation fits.

    An earlier summary at the front is kept if at all possible (it stands for
    many turns) and dropped last, counting as one turn. Earlier drop notes are
    merged into the new one.
    """
    lead = 0
    while lead < start and _is_meta(run.body[lead]):
        lead += 1
    summaries = [m for m in run.body[:lead] if is_summary(m)]
    earlier = sum(_noted_turns(m) or 0 for m in run.body[:lead])
    groups = _turns(run, lead, start)
    sizes = [count_messages(g) for g in groups]
    fixed = count_messages(run.head) + count_messages(run.body[start:])

    kept_after = list(itertools.accumulate(reversed([*sizes, 0])))[::-1]  # kept_after[n] = sum(sizes[n:])
    summaries_size = count_messages(summaries)

    def size(dropped_groups: int, with_summaries: bool) -> int:
        turns = dropped_groups + (0 if with_summaries or not summaries else 1)
        note = count_message(_drop_note(earlier + turns)) if earlier + turns else 0
        kept = kept_after[dropped_groups] + (summaries_size if with_summaries else 0)
        return fixed + note + kept

    # the fewest turns to drop: size shrinks with every turn dropped, so bisect
    n = bisect.bisect_left(range(len(groups)), True, key=lambda k: size(k, True) <= run.target)
    drop_summaries = bool(summaries) and size(n, True) > run.target
    turns = n + (1 if drop_summaries else 0)
    if not turns:
        return
    carried = [] if drop_summaries else summaries
    rest = [m for group in groups[n:] for m in group]
    run.body = [*carried, _drop_note(earlier + turns), *rest, *run.body[start:]]
    run.dropped = turns
    run.dropped_messages = lead - len(carried) + sum(len(g) for g in groups[:n])
    run.reach("dropped")


def _turns(run: _Run, lo: int, hi: int) -> list[list[Message]]:
    """``run.body[lo:hi]`` split into turns: each starts at a user message (the first may not)."""
    starts = [k for k in range(lo + 1, hi) if run.cuttable[k] and run.body[k].get("role") == "user"]
    bounds = [lo, *starts, hi] if lo < hi else []
    return [run.body[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


# ---------------------------------------------------------------- messages


def _cut_points(body: list[Message]) -> list[bool]:
    """``cuttable[k]``: the body may be split before ``body[k]``.

    Never before a tool message, nor anywhere between an assistant message
    with tool calls and the last tool message answering it.
    """
    n = len(body)
    last_answer = {m.get("tool_call_id"): j for j, m in enumerate(body) if m.get("role") == "tool"}
    depth_change = [0] * (n + 2)
    for i, message in enumerate(body):
        calls = message.get("tool_calls") or ()
        end = max([i, *(last_answer.get(call.get("id"), i) for call in calls)])
        if end > i:
            depth_change[i + 1] += 1
            depth_change[end + 1] -= 1
    cuttable = [True]
    depth = 0
    for k in range(1, n):
        depth += depth_change[k]
        cuttable.append(depth == 0 and body[k].get("role") != "tool")
    return [*cuttable, True] if n else cuttable


def _tool_names(messages: Sequence[Mapping[str, Any]]) -> dict[Any, str]:
    """tool_call_id -> function name, from the assistant messages' tool calls."""
    names: dict[Any, str] = {}
    for message in messages:
        for call in message.get("tool_calls") or ():
            name = (call.get("function") or {}).get("name")
            if name:
                names[call.get("id")] = name
    return names


def _noted_turns(message: Mapping[str, Any]) -> int | None:
    """The turn count of a drop note made by this module; None for any other message."""
    content = message.get("content")
    if message.get("role") != "system" or not isinstance(content, str):
        return None
    match = _DROP_NOTE.match(content)
    return int(match.group(1)) if match else None


def _is_meta(message: Mapping[str, Any]) -> bool:
    """A summary or a drop note: messages compaction made, not the conversation's own."""
    return is_summary(message) or _noted_turns(message) is not None


def _summary_message(text: str) -> Message:
    return {"role": "system", "content": f"{SUMMARY_HEADER}\n{text}"}


def _drop_note(turns: int) -> Message:
    verb = "turn was" if turns == 1 else "turns were"
    return {
        "role": "system",
        "content": f"[{turns} earlier {verb} dropped to fit the context window]",
    }


def _transcript_entry(message: Mapping[str, Any], names: Mapping[Any, str]) -> str:
    """One message as transcript text for the summarizer."""
    role = str(message.get("role") or "unknown")
    text = _plain_text(message.get("content"))
    if role == "tool":
        tool = names.get(message.get("tool_call_id")) or message.get("name") or "unknown tool"
        label = f"tool result: {tool}"
        text = _elide(text, _TRANSCRIPT_TOOL_CHARS)
    else:
        label = f"{role} ({message['name']})" if message.get("name") else role
    lines = [f"[{label}]"]
    if text:
        lines.append(text)
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        lines.append(f"-> called {function.get('name')}({function.get('arguments') or ''})")
    return "\n".join(lines)


def _plain_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, Mapping) and isinstance(part.get("text"), str):
            parts.append(part["text"])
        else:
            kind = part.get("type", "attachment") if isinstance(part, Mapping) else "attachment"
            parts.append(f"[{kind}]")
    return "\n".join(parts)


def _elide(text: str, limit: int) -> str:
    """The text with its middle cut out when longer than ``limit`` characters."""
    if len(text) <= limit:
        return text
    head = limit * 3 // 4
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters left out ...]\n{text[-tail:]}"
