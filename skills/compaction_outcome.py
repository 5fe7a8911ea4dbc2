"""What a compaction did: the `outcome` a skill's `on_compaction(outcome, ctx)` receives.

It lives in the SDK (not with the compaction rules in the orchestrator) because skills in a
worker group read it too: a worker parses it without importing the orchestrator.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Stage = Literal["none", "cleared", "summarized", "dropped"]
Message = dict[str, Any]
AUTO_OFF = "automatic compaction is off"


BETWEEN_TURNS_PREFIX = "compaction-"
"""The completion id of an on_compaction stage that no request runs (between turns) is
this prefix and the outcome's id: it names no request, so nothing is pinned or journaled
for it."""


def between_turns_id(outcome_id: str) -> str:
    return f"{BETWEEN_TURNS_PREFIX}{outcome_id}"


class Compaction(BaseModel):
    """What a compaction did. ``before``/``after`` are token counts of the
    input and of ``messages``; ``summarized`` counts messages folded into the
    summary, ``kept`` the messages carried over besides the system prompt,
    ``cleared`` the tool outputs replaced by a note, ``dropped`` the turns
    dropped. ``target`` is the count compaction aimed at; ``reason`` says
    why it fell short (the summary failed, automatic compaction is off). A
    ``summarized`` outcome with a ``reason`` (and ``summary`` None) is one whose
    model summary failed: its summary message quotes the user's words alone.

    ``id`` and ``created`` (unix time) name this one compaction: a consumer
    that may see it twice (a redelivered ``on_compaction`` hop) stores it once."""

    model_config = ConfigDict(frozen=True)

    stage: Stage
    messages: list[Message]
    before: int
    after: int
    window: int
    target: int
    summary: str | None = None
    summarized: int = 0
    kept: int = 0
    cleared: int = 0
    dropped: int = 0
    reason: str | None = None
    focus: str | None = None
    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    created: float = Field(default_factory=time.time)

    def sentence(self) -> str:
        """One line for a person: what was done and how full the context is now."""
        cleared = f", cleared {_plural(self.cleared, 'tool output')}" if self.cleared else ""
        failed = f"Summary failed ({self.reason})"
        if self.stage == "summarized" and self.reason:
            text = (
                f"{failed}; replaced {self.summarized} messages with the user's own words quoted, "
                f"kept {self.kept}{cleared}."
            )
        elif self.stage == "summarized":
            text = f"Compacted the conversation: summarized {self.summarized} messages, kept {self.kept}{cleared}."
        elif self.stage == "dropped":
            turns = "the oldest turn" if self.dropped == 1 else f"the {self.dropped} oldest turns"
            text = f"{failed}; dropped {turns}{cleared}."
        elif self.stage == "cleared":
            text = f"Cleared {_plural(self.cleared, 'old tool output')}"
            text += f"; {failed[0].lower()}{failed[1:]}." if self.reason else "."
        elif self.reason == AUTO_OFF:
            text = f"Nothing compacted: {AUTO_OFF}."
        else:
            text = f"{failed}; nothing was changed." if self.reason else "No compaction needed."
        if self.stage != "none" and self.after > self.target:
            text += f" Still above the target of {self.target} tokens."
        percent = round(100 * self.after / self.window) if self.window else 0
        return f"{text} Context {percent}% full."


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


