"""Skills the cluster tests host: in the orchestrator (a finalize ledger) and in worker groups."""

from __future__ import annotations

from hookbus import Compaction
from hookbus.skills import Context, HookData, Skill, hook


class Ledger(Skill):
    """In-process: every finalize_connection, as (completion id, error status or None)."""

    name = "ledger"

    def __init__(self) -> None:
        self.finalized: list[tuple[str, int | None]] = []

    @hook("finalize_connection")
    def record(self, data: HookData, ctx: Context) -> None:
        self.finalized.append((ctx.completion_id, data.error.status_code if data.error else None))


class RemoteCounter(Skill):
    """Hosted in a worker group: the ids of the compactions it was told about."""

    name = "counter"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def on_compaction(self, outcome: Compaction, ctx: Context | None) -> None:
        self.calls.append(outcome.id)




class TagA(Skill):
    """Hosted in a worker group: appends "+a" to the last message at on_connection. With
    TagB in a group that registered later (the same priority: registry order breaks the
    tie), the stage is sent on from one group to the other."""

    name = "tag-a"
    label = "a"

    @hook("on_connection", 10)
    async def tag(self, data: HookData, ctx: Context) -> HookData:
        last = data.messages[-1]
        data.messages[-1] = {**last, "content": f"{last['content']} +{self.label}"}
        return data


class TagB(TagA):
    name = "tag-b"
    label = "b"
