"""A finalize_connection recorder for tests whose Redis may forget (a restart) or whose
client may never see the end (a stalled reader): it counts, in this process, how often
finalize ran for each completion id and the error code it saw (None: success)."""

from __future__ import annotations

from collections import Counter

from hookbus import Context, HookData, Skill, hook


class Finals(Skill):
    name = "finals"

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.codes: dict[str, str | None] = {}

    @hook("finalize_connection")
    async def record(self, data: HookData, ctx: Context) -> None:
        self.runs[ctx.metadata.completion_id] += 1
        self.codes[ctx.metadata.completion_id] = data.error.code if data.error else None
