"""An observer group for the fault tests, loaded by `hookbus worker` subprocesses
(`tests.faults.observer_skills:Watcher`).

Every call is recorded in Redis under `{HOOKBUS_PREFIX}test:observed:{completion id}`
(replica, lifecycle, attempt; for finalize_connection also `ctx.recovery` and the code
of `data.error`), so the test sees it after the replica was killed. A user
text with `ohold=SECONDS` makes the finalize_connection observer hold that long on the
first delivery: the replica is then in the middle of the request's entry (its earlier
stages observed, the last not yet), where a test kills it.
"""

from __future__ import annotations

import asyncio
import json

from hookbus.skills import Context, HookData, Skill, hook
from tests.faults.fault_skills import NAME, fault_key, param, redis_client, user_text


class Watcher(Skill):
    name = "watcher"

    async def _record(self, data: HookData, ctx: Context) -> None:
        entry: dict[str, object] = {"by": NAME, "lifecycle": data.lifecycle, "attempt": ctx.call.attempt}
        if data.lifecycle == "finalize_connection":
            entry.update(recovery=ctx.recovery, error=data.error.code if data.error else None)
        await redis_client().rpush(fault_key("observed", ctx.completion_id), json.dumps(entry))

    @hook("on_connection", observe=True)
    async def connection(self, data: HookData, ctx: Context) -> None:
        ctx.state["text"] = user_text(data.messages)
        await self._record(data, ctx)

    @hook("after_llm_call", observe=True)
    async def answered(self, data: HookData, ctx: Context) -> None:
        await self._record(data, ctx)

    @hook("finalize_connection", observe=True)
    async def finalize(self, data: HookData, ctx: Context) -> None:
        await self._record(data, ctx)
        seconds = param(ctx.state.get("text", ""), "ohold")
        if seconds and ctx.call.attempt == 1:
            await asyncio.sleep(seconds)  # the point: the replica is mid-entry when it is killed
