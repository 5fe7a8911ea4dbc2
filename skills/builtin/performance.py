"""PerformanceMonitor: tool and LLM timings per request, logged as one summary."""

from __future__ import annotations

from typing import Any

from hookbus.skills.builtin._common import (
    env_float,
    logger,
    read_section,
    stage_began,
    stage_ended,
    state_section,
    sub_dict,
    usage_numbers,
)
from hookbus.skills.context import Context
from hookbus.skills.data import HookData
from hookbus.skills.decorators import hook
from hookbus.skills.skill import Skill

STATE_KEY = "perf"
LOGGER_NAME = "hookbus.skills.performance"


class PerformanceMonitor(Skill):
    """Times every tool call (keyed by `tool_id`) and every LLM call of a request.

    Every hook is an observer (`observe=True`): no request waits for the timing. A call
    starts when the stage before it ended (`before_toolcall`, `before_llm_call`) and ends
    when the stage after it began (`after_toolcall`, `after_llm_call`): the stage times an
    observer is given (hookbus.skills.observing), so `ms` is the call's own run time.
    Everything lives in `ctx.state["perf"]`, the observers' own state (blocking hooks of
    the request do not see it; plain JSON, wall-clock stamps, so the start and the end
    of a call may be seen by different replicas):

    - `tools[tool_id]`: `{"name", "started", "ms", "skipped"}`. A call that a blocking
      hook skipped or blocked (before_toolcall ended with `tool_skipped`) gets
      `ms: None`.
    - `stats[tool_name]`: `{"calls", "timed", "total_ms", "max_ms"}`, recomputed from
      `tools` after each call, so a repeated `after_toolcall` counts nothing twice.
    - `llm[iteration]`: `{"ms", "prompt_tokens", "completion_tokens", "total_tokens"}`
      per LLM call (`ms` is None if the start was not seen).

    `finalize_connection` (priority 100) logs `performance_summary`: `tool_calls`,
    `tool_ms` (per tool_id), `tools` (per-tool stats), `slowest`
    (`{"tool_id", "name", "ms"}` or None), `llm_calls`, `llm_ms` and the token totals;
    safe when any of it is missing. A tool call slower than `slow_tool_ms` also logs a
    `slow_tool_call` warning when it ends.

    Configuration:
        slow_tool_ms: threshold of the `slow_tool_call` warning; env
            `HOOKBUS_SLOW_TOOL_MS`, default 5000.
    """

    name = "performance-monitor"

    def __init__(self, *, slow_tool_ms: float | None = None) -> None:
        self.slow_tool_ms = (
            env_float("HOOKBUS_SLOW_TOOL_MS", 5000.0) if slow_tool_ms is None else slow_tool_ms
        )

    # ------------------------------------------------------------------ tools

    @hook("before_toolcall", 1000, observe=True)
    async def tool_started(self, data: HookData, ctx: Context) -> None:
        tools = sub_dict(state_section(ctx, STATE_KEY), "tools")
        tool_id = data.tool_id or ""
        entry = tools.get(tool_id)
        if isinstance(entry, dict) and "started" in entry:
            return  # seen already (a redelivered hop): keep the first start
        if data.tool_skipped:
            tools[tool_id] = {"name": _tool_name(data)}  # skipped or blocked: nothing ran to time
            return
        tools[tool_id] = {"name": _tool_name(data), "started": stage_ended(ctx)}

    @hook("after_toolcall", 0, observe=True)
    async def tool_finished(self, data: HookData, ctx: Context) -> None:
        perf = state_section(ctx, STATE_KEY)
        tools = sub_dict(perf, "tools")
        tool_id = data.tool_id or ""
        entry = tools.get(tool_id)
        if not isinstance(entry, dict):
            entry = {"name": _tool_name(data)}
        if "ms" in entry:
            return  # finished already: idempotent
        started = entry.get("started")
        ms = None
        if isinstance(started, int | float):
            ms = round(max(0.0, stage_began(ctx) - started) * 1000, 3)
        entry.update(ms=ms, skipped=bool(data.tool_skipped))
        tools[tool_id] = entry
        perf["stats"] = _tool_stats(tools)
        if ms is not None and ms > self.slow_tool_ms:
            logger(LOGGER_NAME, ctx).warning(
                "slow_tool_call", tool=entry.get("name"), tool_id=tool_id, ms=ms
            )

    # -------------------------------------------------------------------- llm

    @hook("before_llm_call", 1000, observe=True)
    async def llm_started(self, data: HookData, ctx: Context) -> None:
        llm = sub_dict(state_section(ctx, STATE_KEY), "llm")
        llm.setdefault(str(data.iteration or 0), {"started": stage_ended(ctx)})

    @hook("after_llm_call", 0, observe=True)
    async def llm_finished(self, data: HookData, ctx: Context) -> None:
        llm = sub_dict(state_section(ctx, STATE_KEY), "llm")
        key = str(data.iteration or 0)
        entry = llm.get(key)
        if not isinstance(entry, dict):
            entry = {}
        started = entry.get("started")
        ms = entry.get("ms")
        if ms is None and isinstance(started, int | float):
            ms = round(max(0.0, stage_began(ctx) - started) * 1000, 3)
        usage = data.usage if data.usage is not None else getattr(data.response, "usage", None)
        entry.update(ms=ms, **usage_numbers(usage))
        llm[key] = entry

    # -------------------------------------------------------------- summary

    def summary(self, ctx: Context) -> dict[str, Any]:
        """The request's performance figures from `ctx.state` (empty ones if absent)."""
        perf = read_section(ctx, STATE_KEY)
        tools: dict[str, Any] = perf["tools"] if isinstance(perf.get("tools"), dict) else {}
        llm: dict[str, Any] = perf["llm"] if isinstance(perf.get("llm"), dict) else {}
        timed = {
            tool_id: entry["ms"]
            for tool_id, entry in tools.items()
            if isinstance(entry, dict) and isinstance(entry.get("ms"), int | float)
        }
        slowest = None
        if timed:
            tool_id = max(timed, key=lambda key: timed[key])
            slowest = {"tool_id": tool_id, "name": tools[tool_id].get("name"), "ms": timed[tool_id]}
        calls = [entry for entry in llm.values() if isinstance(entry, dict) and "ms" in entry]
        return {
            "tool_calls": len(tools),
            "tool_ms": timed,
            "tools": _tool_stats(tools),
            "slowest": slowest,
            "llm_calls": len(calls),
            "llm_ms": round(sum(c["ms"] for c in calls if isinstance(c["ms"], int | float)), 3),
            "prompt_tokens": sum(int(c.get("prompt_tokens") or 0) for c in calls),
            "completion_tokens": sum(int(c.get("completion_tokens") or 0) for c in calls),
            "total_tokens": sum(int(c.get("total_tokens") or 0) for c in calls),
        }

    @hook("finalize_connection", 100, observe=True)
    async def log_summary(self, data: HookData, ctx: Context) -> None:
        perf = read_section(ctx, STATE_KEY)
        if perf.get("logged"):
            return
        logger(LOGGER_NAME, ctx).info("performance_summary", **self.summary(ctx))
        state_section(ctx, STATE_KEY)["logged"] = True


def _tool_name(data: HookData) -> str:
    function = (data.tool_call or {}).get("function") or {}
    return str(function.get("name") or "")


def _tool_stats(tools: dict[str, Any]) -> dict[str, dict[str, Any]]:
    stats: dict[str, dict[str, Any]] = {}
    for entry in tools.values():
        if not isinstance(entry, dict) or "ms" not in entry:
            continue  # still running
        name = str(entry.get("name") or "")
        item = stats.setdefault(name, {"calls": 0, "timed": 0, "total_ms": 0.0, "max_ms": None})
        item["calls"] += 1
        ms = entry.get("ms")
        if isinstance(ms, int | float):
            item["timed"] += 1
            item["total_ms"] = round(item["total_ms"] + ms, 3)
            item["max_ms"] = ms if item["max_ms"] is None else max(item["max_ms"], ms)
    return stats
