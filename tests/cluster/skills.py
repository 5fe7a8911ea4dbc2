"""Skills the cluster tests host: in the orchestrator (a finalize ledger) and in worker groups."""

from __future__ import annotations

from typing import Any

from hookbus import Compaction
from hookbus.skills import Context, HookData, Skill, hook, tool

SYSTEM = {"role": "system", "content": "You are a careful assistant."}


class Ledger(Skill):
    """In-process: every finalize_connection, as (completion id, error status or None)."""

    name = "ledger"

    def __init__(self) -> None:
        self.finalized: list[tuple[str, int | None]] = []

    @hook("finalize_connection")
    def record(self, data: HookData, ctx: Context) -> None:
        self.finalized.append((ctx.completion_id, data.error.status_code if data.error else None))


class Notes(Skill):
    name = "notes"

    @tool
    def remember(self, note: str, ctx: Context) -> str:
        """Remember a note for this conversation."""
        ctx.session.data.setdefault("notes", []).append(note)
        return f"noted ({len(ctx.session.data['notes'])})"


class RemoteCounter(Skill):
    """Hosted in a worker group: the ids of the compactions it was told about."""

    name = "counter"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def on_compaction(self, outcome: Compaction, ctx: Context | None) -> None:
        self.calls.append(outcome.id)


def conversation(turns: int, words: int = 60) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [dict(SYSTEM)]
    for t in range(turns):
        messages += [
            {"role": "user", "content": f"Question {t}: " + " ".join(["alpha"] * words)},
            {"role": "assistant", "content": f"Answer {t}: " + " ".join(["beta"] * words)},
        ]
    return messages
