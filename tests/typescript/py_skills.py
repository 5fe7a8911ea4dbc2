"""The Python side of the TypeScript end-to-end test: a worker group whose hooks sit between
the TypeScript group's in priority, and the agent its orchestrator runs.

Every hook call appends one JSON line to the file named by HOOKBUS_TS_JOURNAL, the same
file the TypeScript skills append to, so the test reads one order across both languages.
"""

from __future__ import annotations

import json
import os
from typing import Any

from hookbus import Agent, CompactionPolicy, Context, HookData, Skill, hook


def note(ctx: Context, hook_name: str, **extra: Any) -> None:
    line = json.dumps({"lang": "py", "cid": ctx.metadata.completion_id, "hook": hook_name, **extra})
    with open(os.environ["HOOKBUS_TS_JOURNAL"], "a") as journal:
        journal.write(line + "\n")


class OrderProbe(Skill):
    name = "py-probe"

    @hook("on_connection", 5)
    async def first(self, data: HookData, ctx: Context) -> None:
        note(ctx, "py-probe.first")

    @hook("on_connection", 30)
    async def middle(self, data: HookData, ctx: Context) -> None:
        ctx.state["py_mark"] = "python was here"
        note(ctx, "py-probe.middle")

    @hook("on_connection", 60)
    async def last(self, data: HookData, ctx: Context) -> None:
        note(ctx, "py-probe.last", ts_mark=ctx.state.get("ts_mark"), ts_visits=ctx.session.data.get("ts_visits"))

    @hook("before_toolcall", 5)
    async def check_tool(self, data: HookData, ctx: Context) -> None:
        note(ctx, "py-probe.check_tool", tool=(data.tool_call or {}).get("function", {}).get("name"))

    @hook("finalize_connection", 90)
    async def finalize(self, data: HookData, ctx: Context) -> None:
        note(ctx, "py-probe.finalize", error=data.error.status_code if data.error else None)


agent = Agent("ts-e2e")


parity_agent = Agent("ts-parity", compaction_policy=CompactionPolicy(window=1000))
"""The parity test's agent: a 1,000-token window, so a long conversation is compacted in its run."""
