"""A long conversation for the compaction tests: a system prompt, then question and answer
turns of a chosen length."""

from __future__ import annotations

from typing import Any

SYSTEM = {"role": "system", "content": "You are a careful assistant."}


def conversation(turns: int, words: int = 60) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [dict(SYSTEM)]
    for t in range(turns):
        messages += [
            {"role": "user", "content": f"Question {t}: " + " ".join(["alpha"] * words)},
            {"role": "assistant", "content": f"Answer {t}: " + " ".join(["beta"] * words)},
        ]
    return messages
