"""Runs an ordered list of hooks over one stage's data, with hookbus's error semantics.

The same function runs hooks in the orchestrator's process and in a worker replica, so a
hook behaves the same wherever the deployment puts it:

- a `HookError` aborts the run (except in `finalize_connection`, where every hook runs);
- a plain exception (or a timeout) in `before_toolcall` blocks that tool call;
- elsewhere it is logged, the hook's changes are discarded and the chain goes on,
  unless the hook is `critical`, which turns it into a 500 that aborts the run.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog

from hookbus.skills.context import Context
from hookbus.skills.data import HookData
from hookbus.skills.errors import HookError
from hookbus.skills.skill import BoundHook

log = structlog.get_logger("hookbus.hooks")

Outcome = Literal["ok", "error", "timeout", "blocked", "aborted"]


@dataclass(slots=True)
class HookOutcome:
    """What happened to one hook call; feeds logs, the events stream and metrics."""

    hook: str
    duration_ms: float
    outcome: Outcome
    error: str | None = None


@dataclass(slots=True)
class ChainResult:
    """The data after the chain, per-hook outcomes, and whether the run must stop."""

    data: HookData
    outcomes: list[HookOutcome] = field(default_factory=list)
    abort: HookError | None = None
    blocked: bool = False


async def run_hooks(
    hooks: Sequence[BoundHook],
    data: HookData,
    ctx: Context,
    *,
    stage_key: str = "",
    attempt: int = 1,
) -> ChainResult:
    """Run `hooks` in order; each sees the previous one's output."""
    result = ChainResult(data)
    for bound in hooks:
        ctx.call.idempotency_key = f"{ctx.metadata.completion_id}:{stage_key or data.lifecycle}:{bound.key}"
        ctx.call.attempt = attempt
        saved_fields, saved_state = _snapshot(result.data), copy.deepcopy(ctx.state)
        started = time.perf_counter()
        try:
            returned = await _call(bound, result.data, ctx)
        except HookError as exc:
            result.outcomes.append(_outcome(bound, started, "aborted", exc.message))
            if data.lifecycle == "finalize_connection":
                log.warning("finalize_hook_error", hook=bound.key, error=repr(exc), completion_id=ctx.completion_id)
                continue
            result.abort = exc
            return result
        except Exception as exc:  # noqa: BLE001 - a hook's failure is data, not a crash
            kind: Outcome = "timeout" if isinstance(exc, TimeoutError) else "error"
            message = _describe(exc, bound)
            _restore(result.data, saved_fields)
            ctx.state.clear()
            ctx.state.update(saved_state)
            log.warning("hook_failed", hook=bound.key, lifecycle=data.lifecycle, error=message, completion_id=ctx.completion_id)
            if bound.spec.critical and data.lifecycle != "finalize_connection":
                result.outcomes.append(_outcome(bound, started, "aborted", message))
                result.abort = HookError(500, "hook_failed", f"critical hook {bound.key} failed: {message}")
                return result
            if data.lifecycle == "before_toolcall":
                result.outcomes.append(_outcome(bound, started, "blocked", message))
                block_tool_call(result.data, bound.key, message)
                result.blocked = True
                return result
            result.outcomes.append(_outcome(bound, started, kind, message))
            continue
        if returned is not None:
            if not isinstance(returned, HookData):
                message = f"returned {type(returned).__name__}, expected HookData or None"
                _restore(result.data, saved_fields)
                result.outcomes.append(_outcome(bound, started, "error", message))
                log.warning("hook_failed", hook=bound.key, error=message, completion_id=ctx.completion_id)
                continue
            result.data = returned
        result.outcomes.append(_outcome(bound, started, "ok"))
    return result


def block_tool_call(data: HookData, hook_key: str, reason: str) -> None:
    """Mark the tool call as blocked; the model then sees `tool_result` as the tool's answer."""
    data.set_internal(tool_skipped=True, tool_result=f"Tool call blocked by {hook_key}: {reason}")


async def _call(bound: BoundHook, data: HookData, ctx: Context) -> Any:
    timeout = bound.spec.timeout
    if inspect.iscoroutinefunction(bound.fn):
        if timeout is None:
            return await bound.fn(data, ctx)
        return await asyncio.wait_for(bound.fn(data, ctx), timeout)
    if timeout is None:
        return bound.fn(data, ctx)
    # A sync hook can only be bounded in time from outside its thread.
    return await asyncio.wait_for(asyncio.to_thread(bound.fn, data, ctx), timeout)


def _snapshot(data: HookData) -> dict[str, Any]:
    """A copy of the fields, the lists and their message dicts, so a failed hook can be undone.

    A hook that edits deeper than a message's own keys (inside `tool_calls`) and then
    raises keeps that edit: a full deep copy per hook call would cost more than it saves.
    """
    saved = dict(data.__dict__)
    for name in ("messages", "tools"):
        if saved[name] is not None:
            saved[name] = [dict(item) for item in saved[name]]
    return saved


def _restore(data: HookData, saved: dict[str, Any]) -> None:
    data.__dict__.update(saved)


def _describe(exc: BaseException, bound: BoundHook) -> str:
    if isinstance(exc, TimeoutError):
        return f"timed out after {bound.spec.timeout}s"
    return f"{type(exc).__name__}: {exc}"


def _outcome(bound: BoundHook, started: float, outcome: Outcome, error: str | None = None) -> HookOutcome:
    return HookOutcome(bound.key, (time.perf_counter() - started) * 1000, outcome, error)
