"""The conformance kit's skills: `Probe` runs in the worker under test, `Reference` in the kit's
own Python group, `Recorder` in the kit's orchestrator.

docs/conformance.md specifies them hook by hook, so that a worker in another language can
host a twin of `Probe` (the TypeScript one: skills/typescript/conformance/probe.ts). What a
hook does depends on the request's `ctx.metadata["conformance"]`, the mode the kit's check
sets:

- every hook of `Probe` and `Reference` that records appends its name to `ctx.state.order`
  (not on_chunk) and a copy of its lifecycle's fields (`FIELDS`) to
  `ctx.state.seen[<name>][<lifecycle>]`;
- unless its mode says otherwise, a hook returns None (data unchanged); the modes make
  `Probe` change data, raise, stall or sleep (see each hook).
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from hookbus.skills import Context, HookData, HookError, Skill, hook, tool

GROUP = "conformance"
"""The group the worker under test runs (HOOKBUS_GROUP)."""
REFERENCE_GROUP = "conformance-reference"

FIELDS: dict[str, tuple[str, ...]] = {
    "on_connection": ("messages", "stream"),
    "before_llm_call": ("messages", "tools", "iteration"),
    "after_llm_call": ("response", "usage", "iteration"),
    "on_chunk": ("chunk", "content", "chunk_index", "full_content"),
    "before_toolcall": ("tool_call", "tool_id"),
    "after_toolcall": ("tool_call", "tool_id", "tool_result"),
    "on_message": ("messages",),
    "finalize_connection": ("messages", "usage", "error"),
}
"""What a recording hook copies of each lifecycle's data (the fields not null)."""

KIT_MAX_HOP_BYTES = 1024 * 1024
"""HOOKBUS_MAX_HOP_BYTES in the worker's environment: smaller than the default, so that the
size checks stay quick (the orchestrator's own bound stays the default)."""
KIT_MAX_STATE_BYTES = 512 * 1024
"""HOOKBUS_MAX_STATE_BYTES in the worker's environment."""
OVER_STATE = "x" * (KIT_MAX_STATE_BYTES + 1024)
"""What mode `big_state` puts in ctx.state.blob: over the state limit, under the hop's."""
OVER_HOP = "y" * (KIT_MAX_HOP_BYTES + 1024)
"""What mode `big_data` makes the last message: over the hop's limit."""

HOOK_ERROR: dict[str, Any] = {
    "status_code": 429, "code": "probe_limit", "message": "probe says slow down", "details": {"retry_after": 7},
}


def mode(ctx: Context) -> str:
    return str(ctx.metadata.get("conformance") or "")


def record(name: str, data: HookData, ctx: Context) -> None:
    """Append `name` to the order and a copy of the lifecycle's fields to what `name` saw."""
    if data.lifecycle != "on_chunk":
        ctx.state.setdefault("order", []).append(f"{name}:{data.lifecycle}")
    copy = data.model_dump(mode="json", include=set(FIELDS[data.lifecycle]), exclude_none=True)
    ctx.state.setdefault("seen", {}).setdefault(name, {}).setdefault(data.lifecycle, []).append(copy)


class Probe(Skill):
    """The skill the worker under test hosts (group `conformance`)."""

    name = "probe"

    @hook("on_connection", 20)
    def connection(self, data: HookData, ctx: Context) -> HookData | None:
        record("probe", data, ctx)
        ctx.state["probe_token"] = ctx.state.get("token")
        if ctx.session.id is not None:
            ctx.session.data["probe_visits"] = int(ctx.session.data.get("probe_visits") or 0) + 1
        if mode(ctx) == "change":
            last = (data.messages or [])[-1]
            last["content"] = str(last["content"]).replace("change me", "changed by probe")
            return data
        if mode(ctx) == "raise":
            data.messages = [{"role": "user", "content": "[[echo]] a change that must be discarded"}]
            raise RuntimeError("probe raised")
        return None

    @hook("on_connection", 21, critical=True)
    def guard(self, data: HookData, ctx: Context) -> None:
        if mode(ctx) == "critical":
            raise RuntimeError("probe guard is down")

    @hook("on_connection", 22, timeout=0.5)
    async def slow(self, data: HookData, ctx: Context) -> None:
        if mode(ctx) == "timeout":
            await asyncio.sleep(5)

    @hook("on_connection", 23, timeout=60)
    async def hold(self, data: HookData, ctx: Context) -> None:
        if mode(ctx) == "kill":
            if ctx.call.attempt == 1:
                await asyncio.sleep(60)  # the kit kills the worker meanwhile
            ctx.state["hold_attempt"] = ctx.call.attempt

    @hook("before_llm_call", 20)
    def before_llm(self, data: HookData, ctx: Context) -> HookData | None:
        record("probe", data, ctx)
        if mode(ctx) == "hook_error":
            raise HookError(**HOOK_ERROR)
        if mode(ctx) == "big_state":
            ctx.state["blob"] = OVER_STATE
        if mode(ctx) == "big_data":
            data.messages = [{"role": "user", "content": OVER_HOP}]
            return data
        return None

    @hook("after_llm_call", 20)
    def after_llm(self, data: HookData, ctx: Context) -> None:
        record("probe", data, ctx)

    @hook("on_chunk", 20)
    def chunk(self, data: HookData, ctx: Context) -> HookData | None:
        record("probe", data, ctx)
        if mode(ctx) == "change" and data.content:
            data.content = data.content.upper()
            return data
        return None

    @hook("before_toolcall", 20)
    def before_tool(self, data: HookData, ctx: Context) -> None:
        record("probe", data, ctx)
        if mode(ctx) == "raise":
            raise RuntimeError("probe blocks the tool")

    @hook("after_toolcall", 20)
    def after_tool(self, data: HookData, ctx: Context) -> HookData | None:
        record("probe", data, ctx)
        if mode(ctx) == "change":
            data.tool_result = f"{data.tool_result} (seen by probe)"
            return data
        return None

    @hook("on_message", 20)
    def message(self, data: HookData, ctx: Context) -> None:
        record("probe", data, ctx)

    @hook("finalize_connection", 20)
    def finalize(self, data: HookData, ctx: Context) -> None:
        record("probe", data, ctx)

    @tool
    def probe_echo(self, text: str, ctx: Context) -> str:
        """Echo the text back."""
        ctx.state["tool_ran"] = True
        return f"echo: {text}"


class Reference(Skill):
    """The kit's own Python group around the probe: `ref10` records before it and `ref30`
    after it at every lifecycle point but on_chunk (where the probe is alone, so that its
    chunks go in batched hops); `ref10` sets `ctx.state.token` first."""

    name = "reference"

    @hook("on_connection", 10)
    def before_on_connection(self, data: HookData, ctx: Context) -> None:
        ctx.state["token"] = ctx.metadata.get("conformance_token")
        record("ref10", data, ctx)

    @hook("on_connection", 30)
    def after_on_connection(self, data: HookData, ctx: Context) -> None:
        record("ref30", data, ctx)

    @hook("before_llm_call", 10)
    def before_before_llm_call(self, data: HookData, ctx: Context) -> None:
        record("ref10", data, ctx)

    @hook("before_llm_call", 30)
    def after_before_llm_call(self, data: HookData, ctx: Context) -> None:
        record("ref30", data, ctx)

    @hook("after_llm_call", 10)
    def before_after_llm_call(self, data: HookData, ctx: Context) -> None:
        record("ref10", data, ctx)

    @hook("after_llm_call", 30)
    def after_after_llm_call(self, data: HookData, ctx: Context) -> None:
        record("ref30", data, ctx)

    @hook("before_toolcall", 10)
    def before_before_toolcall(self, data: HookData, ctx: Context) -> None:
        record("ref10", data, ctx)

    @hook("before_toolcall", 30)
    def after_before_toolcall(self, data: HookData, ctx: Context) -> None:
        record("ref30", data, ctx)

    @hook("after_toolcall", 10)
    def before_after_toolcall(self, data: HookData, ctx: Context) -> None:
        record("ref10", data, ctx)

    @hook("after_toolcall", 30)
    def after_after_toolcall(self, data: HookData, ctx: Context) -> None:
        record("ref30", data, ctx)

    @hook("on_message", 10)
    def before_on_message(self, data: HookData, ctx: Context) -> None:
        record("ref10", data, ctx)

    @hook("on_message", 30)
    def after_on_message(self, data: HookData, ctx: Context) -> None:
        record("ref30", data, ctx)

    @hook("finalize_connection", 10)
    def before_finalize_connection(self, data: HookData, ctx: Context) -> None:
        record("ref10", data, ctx)

    @hook("finalize_connection", 30)
    def after_finalize_connection(self, data: HookData, ctx: Context) -> None:
        record("ref30", data, ctx)


class Recorder(Skill):
    """In the kit's orchestrator: what each request ended with, for the checks to read."""

    name = "recorder"
    ended: ClassVar[dict[str, dict[str, Any]]] = {}

    @hook("finalize_connection", 99)
    def remember(self, data: HookData, ctx: Context) -> None:
        self.ended[ctx.completion_id] = {
            "state": ctx.state,
            "session": dict(ctx.session.data),
            "error": data.error.to_dict() if data.error else None,
        }
