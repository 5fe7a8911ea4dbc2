"""The user's own words, quoted under a compaction summary.

A summary is only as good as the model that writes it: a small model echoes the transcript
or invents one, and what the user asked for is gone for good. So the summary message that
compaction makes holds, after the model's text, the user's earlier messages from the part it
summarized, quoted by hookbus itself. Assistant text and tool results are not quoted: the
model can redo those, not guess what the user said.

Bounds, so quotes stay a small part of a summary whatever the conversation:

* each message is clipped to :data:`CLIP_TOKENS` (whitespace folded to one line, an ellipsis
  when clipped);
* all quotes together take at most 1/:data:`QUOTE_SHARE` of the summary's token limit. When
  they do not fit, the middle ones are left out, and a line says how many: the first messages
  state the task and the last ones what the user wants now, so those are worth more than
  every message cut to a fragment. Only when not even the first fits is it clipped shorter;
* a summary of a summary takes the earlier quotes over as they are (already clipped) and
  re-chooses under the same budget, so repeated compactions never grow them.

Counts use the compaction's token counter (hookbus.services.orchestrator.compaction.tokens).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from hookbus.services.orchestrator.compaction.tokens import count_text, truncate_text

QUOTES_HEADER = "The user's own earlier messages, quoted (oldest first; long ones clipped):"
CLIP_TOKENS = 48
"""Most tokens one quoted message keeps: enough for a task statement, not for a pasted file."""
MIN_CLIP_TOKENS = 8
"""When even the first message does not fit clipped to CLIP_TOKENS, it is clipped to the room
left, unless that is below this: a few words of the task beat none."""
QUOTE_SHARE = 2
"""Quotes take at most 1/2 of the summary's token limit; the model's summary has the rest."""
ELLIPSIS = "…"
_CLIP_CHARS = CLIP_TOKENS * 16
"""Characters of a message read for its quote: far more than CLIP_TOKENS tokens of text."""
_QUOTE = "> "
_LEFT_OUT = re.compile(r"^\[(\d+) more of the user's messages (?:is|are) not quoted\]$")

Entry = str | int
"""A quoted message (its clipped text), or a count of user messages left out."""


def clip(text: str) -> str:
    """``text`` on one line, at most :data:`CLIP_TOKENS` tokens with the ellipsis."""
    head = " ".join(text[:_CLIP_CHARS].split())  # a long message is never encoded whole
    if count_text(head) > CLIP_TOKENS:
        return _clipped(head)
    line = head if len(text) <= _CLIP_CHARS else " ".join(text.split())
    return line if count_text(line) <= CLIP_TOKENS else _clipped(line)


def _clipped(line: str) -> str:
    return truncate_text(line, CLIP_TOKENS - count_text(ELLIPSIS)).rstrip() + ELLIPSIS


def split_summary(content: str) -> tuple[str, list[Entry]]:
    """A summary message's text (after its header) as the model's part and its quotes."""
    text, marker, block = content.rpartition(f"\n\n{QUOTES_HEADER}\n")
    if not marker:
        return content, []
    entries: list[Entry] = []
    for line in block.splitlines():
        left_out = _LEFT_OUT.match(line)
        if left_out:
            entries.append(int(left_out.group(1)))
        elif line.startswith(_QUOTE):
            entries.append(line[len(_QUOTE) :])
    return text, entries


def without_quotes(text: str) -> str:
    """The model's summary cut before any quotes header it echoed from the transcript."""
    return text.split(QUOTES_HEADER, 1)[0].rstrip()


def quote_block(entries: Iterable[Entry], limit: int) -> str:
    """The quotes section for a summary with ``limit`` tokens ('' when there is nothing to quote
    or no room), starting with a blank line, at most ``limit // QUOTE_SHARE`` tokens."""
    items = list(entries)
    quotes = [i for i, item in enumerate(items) if isinstance(item, str)]
    if not items:
        return ""
    budget = limit // QUOTE_SHARE - count_text(f"\n\n{QUOTES_HEADER}\n") - count_text(_left_out(999))
    chosen = _ends_first(quotes, [count_text(f"{_QUOTE}{items[i]}\n") for i in quotes], budget)
    if quotes and not chosen:  # the first message states the task: quote it shorter rather than not at all
        first = items[quotes[0]]
        room = budget - count_text(f"{_QUOTE}\n{ELLIPSIS}")
        if room >= MIN_CLIP_TOKENS:
            items[quotes[0]] = truncate_text(str(first), room).rstrip() + ELLIPSIS
            chosen = {quotes[0]}
    while chosen:
        block = _render(items, chosen)
        if count_text(block) <= limit // QUOTE_SHARE:
            return block
        chosen.discard(max(chosen))  # the counts of separate lines did not add up: one less
    return ""


def _ends_first(indexes: list[int], costs: list[int], budget: int) -> set[int]:
    """The quotes to keep: taken from both ends in turn (first, last, second, second to last...)
    while they fit, so what is left out is a run in the middle."""
    chosen: set[int] = set()
    low, high, from_front = 0, len(indexes) - 1, True
    open_ends = {True, False}
    while low <= high and open_ends:
        if from_front not in open_ends:
            from_front = not from_front
        at = low if from_front else high
        if costs[at] <= budget:
            budget -= costs[at]
            chosen.add(indexes[at])
            low, high = (low + 1, high) if from_front else (low, high - 1)
        else:
            open_ends.discard(from_front)
        from_front = not from_front
    return chosen


def _render(items: list[Entry], chosen: set[int]) -> str:
    """The section: chosen quotes in order; one line counting every message not quoted, where
    the first of them was."""
    left_out = sum(
        item if isinstance(item, int) else 1 for i, item in enumerate(items) if i not in chosen
    )
    lines = [QUOTES_HEADER]
    for i, item in enumerate(items):
        if i in chosen:
            lines.append(f"{_QUOTE}{item}")
        elif left_out:
            lines.append(_left_out(left_out))
            left_out = 0
    return "\n\n" + "\n".join(lines)


def _left_out(count: int) -> str:
    verb = "is" if count == 1 else "are"
    return f"[{count} more of the user's messages {verb} not quoted]"
