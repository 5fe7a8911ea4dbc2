"""Skills and an agent for the tracing tests, loaded by real `hookbus worker` / `hookbus
orchestrator` subprocesses (`tests.tracing.traced_skills:Guard`, `...:agent`).

`Guard` (worker group `guard`): hooks on on_connection, before_toolcall and
finalize_connection, and a `weather` tool; its on_connection hook logs a line (so the
worker's log can be joined to the trace) and refuses the caller `broke` with a 402. `Notes` runs in the orchestrator's process (an
in-process hook span). `Fails` (group `fails`) raises in after_llm_call (a failed hook).
"""

from __future__ import annotations

import structlog

from hookbus import Agent
from hookbus.skills import Context, HookData, PaymentRequired, Skill, hook, tool

log = structlog.get_logger("tests.traced")


class Guard(Skill):
    name = "guard"

    @hook("on_connection", 10)
    async def admit(self, data: HookData, ctx: Context) -> None:
        log.info("guard_admitted", completion_id=ctx.completion_id)
        if ctx.auth.peer_user_id == "broke":
            raise PaymentRequired("no credit left", {"balance": 0})

    @hook("before_toolcall", 10)
    async def check(self, data: HookData, ctx: Context) -> None:
        return None

    @hook("finalize_connection", 10)
    async def settle(self, data: HookData, ctx: Context) -> None:
        return None

    @tool
    def weather(self, city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"


class Fails(Skill):
    name = "fails"

    @hook("after_llm_call", 10)
    async def explode(self, data: HookData, ctx: Context) -> None:
        raise RuntimeError("the after_llm_call hook broke")


class Notes(Skill):
    name = "notes"

    @hook("before_llm_call", 5)
    async def note(self, data: HookData, ctx: Context) -> None:
        ctx.state["rounds"] = ctx.state.get("rounds", 0) + 1


agent = Agent("traced", skills=[Notes()])
