"""Runs an ordered list of hooks over one stage's data, with hookbus's failure rules.

The rules are written here once and used for in-process hooks, for hooks in a worker
replica, and (through `fail_unanswered`) for a hop that failed as a whole, so a hook
behaves the same wherever the deployment puts it:

- a `HookError` aborts the run (except at the notification points, `finalize_connection`
  and `on_compaction`, where it is logged and every hook runs);
- a failure (a plain exception, a `ServiceError` the hook's own code met, a timeout, a
  hook that returns something other than this stage's `HookData` or None, or a hop
  nobody answered) refuses the request with a 503
  `guard_unavailable` when the hook is a `guard`, aborts the run as a 500 when it is
  `critical`; in `before_toolcall` it blocks that tool call (also when no worker could
  run the hook: it fails closed); elsewhere, and always at a notification point, the
  data is left unchanged and the chain goes on;
- on every failure path the hook's changes to the data and to `ctx.state` are undone.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog

from hookbus.skills.context import Context
from hookbus.skills.data import HookData
from hookbus.skills.descriptors import HookDescriptor
from hookbus.skills.errors import GuardUnavailable, HookbusError, HookError
from hookbus.skills.lifecycle import NOTIFICATIONS, Lifecycle
from hookbus.skills.outcome import Outcome
from hookbus.skills.skill import BoundHook

log = structlog.get_logger("hookbus.hooks")


Effect = Literal["refuse", "abort", "block", "unchanged"]

HookObserver = Callable[[str, Lifecycle], AbstractContextManager[Any]]
"""Wraps each hook call, given (hook key, lifecycle): how a service traces hooks without
skills knowing of it (hookbus.services.observability.tracing.hook_observer)."""


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
    abort: HookbusError | None = None
    blocked: bool = False


def stage_goes_on(lifecycle: Lifecycle, aborted: bool, blocked: bool) -> bool:
    """Whether a stage's next segment runs after one that ended so: an abort ends the
    stage (except at a notification point, where every hook runs), a block ends the chain.
    The orchestrator's loop and a worker sending a stage on (hookbus.bus.hops.send_on) ask this
    one rule."""
    return not blocked and (not aborted or lifecycle in NOTIFICATIONS)


def failure_effect(descriptor: HookDescriptor) -> Effect:
    """What a failed hook does to the run, whether it ran and failed or never ran (no
    worker): a guard refuses the request, a critical hook stops the run, a
    before_toolcall hook blocks its call (a check that could not run does not let the
    call through)."""
    if descriptor.lifecycle in NOTIFICATIONS:
        return "unchanged"
    if descriptor.guard:
        return "refuse"
    if descriptor.critical:
        return "abort"
    if descriptor.lifecycle == "before_toolcall":
        return "block"
    return "unchanged"


async def run_hooks(
    hooks: Sequence[BoundHook],
    data: HookData,
    ctx: Context,
    *,
    stage_key: str = "",
    attempt: int = 1,
    observe: HookObserver | None = None,
) -> ChainResult:
    """Run `hooks` in order; each sees the previous one's output. `observe`, if given,
    wraps each call (an exception the hook raises passes through it)."""
    result = ChainResult(data)
    lifecycle = data.lifecycle
    key_prefix = f"{ctx.metadata.completion_id}:{stage_key or lifecycle}:"
    for bound in hooks:
        ctx.call.idempotency_key = key_prefix + bound.key
        ctx.call.attempt = attempt
        saved_fields, saved_state = _snapshot(result.data), copy_state(ctx.state)
        chunk_before = (result.data.content, chunk_text(result.data)) if lifecycle == Lifecycle.ON_CHUNK else None
        started = time.perf_counter()
        try:
            if observe is None and bound.is_async and bound.descriptor.timeout is None:  # the common case, inline
                returned = await bound.fn(result.data, ctx)
            elif observe is None:
                returned = await _call(bound.fn, (result.data, ctx), bound.descriptor.timeout, bound.is_async)
            else:
                with observe(bound.key, lifecycle):
                    returned = await _call(bound.fn, (result.data, ctx), bound.descriptor.timeout, bound.is_async)
            if returned is not None:
                _check_return(returned, lifecycle)
        except HookError as exc:
            _restore(result.data, saved_fields, ctx, saved_state)
            result.outcomes.append(_outcome(bound.key, started, Outcome.ABORTED, exc.message))
            if lifecycle in NOTIFICATIONS:
                log.warning("notification_hook_error", hook=bound.key, lifecycle=lifecycle, error=repr(exc), completion_id=ctx.completion_id)
                continue
            result.abort = exc
            return result
        except Exception as exc:  # noqa: BLE001 - a hook's failure is data, not a crash
            _restore(result.data, saved_fields, ctx, saved_state)
            message = _describe(exc, bound.descriptor.timeout)
            log.warning("hook_failed", hook=bound.key, lifecycle=lifecycle, error=message, completion_id=ctx.completion_id)
            kind = Outcome.TIMEOUT if isinstance(exc, TimeoutError) else Outcome.FAILED
            if _fail(result, bound.descriptor, message, shown=_in_words(exc, bound.descriptor.timeout)) == "unchanged":
                result.outcomes.append(_outcome(bound.key, started, kind, message))
                continue
            result.outcomes.append(
                _outcome(bound.key, started, Outcome.ABORTED if result.abort else Outcome.BLOCKED, message)
            )
            return result
        if returned is not None:
            result.data = returned
        if chunk_before is not None:
            _chunk_text_agrees(result.data, *chunk_before)
        result.outcomes.append(_outcome(bound.key, started, Outcome.OK))
    return result


def chunk_text(data: HookData) -> str | None:
    """The text of an on_chunk stage's chunk (its first choice's delta), None without one."""
    if data.chunk is None or not data.chunk.choices:
        return None
    return data.chunk.choices[0].delta.content


def _chunk_text_agrees(data: HookData, content: str | None, text: str | None) -> None:
    """After an on_chunk hook, `content` and the chunk's text say the same for the next hook:
    a hook that changed `content` changed the chunk's text (as the client gets it), a hook
    that changed only the chunk's text changed `content`. `full_content` is the model's
    text and stays as it was (docs/hooks.md)."""
    chunk = data.chunk
    if chunk is None or not chunk.choices:
        return
    delta, now = chunk.choices[0].delta, data.content
    if now is not content and now != content:  # identity first: an unchanged text is the same object
        delta.content = now
    elif delta.content is not text and delta.content != text:
        data.set_internal(content=delta.content)


def fail_unanswered(
    data: HookData,
    hooks: Sequence[HookDescriptor],
    reason: str,
    outcome: Outcome,
) -> ChainResult:
    """Hooks whose hop failed as a whole: the same rules as a hook that failed, with the
    data unchanged; the most drastic effect among them wins. `Outcome.SKIPPED` (no
    worker): a critical hook fails the run with a 503 `no_worker`."""
    result = ChainResult(data, [HookOutcome(h.key, 0.0, outcome, reason) for h in hooks])
    order: list[Effect] = ["refuse", "abort", "block", "unchanged"]
    first = min(hooks, key=lambda h: order.index(failure_effect(h)))
    _fail(result, first, reason, called=outcome != Outcome.SKIPPED)
    return result


def _fail(
    result: ChainResult, descriptor: HookDescriptor, reason: str, *, called: bool = True, shown: str | None = None
) -> Effect:
    """Apply a failed hook's rule. `reason` goes to the model (a blocked tool call) and the
    events; `shown` (default `reason`) is what a client may read: no exception's class."""
    effect = failure_effect(descriptor)
    if effect == "refuse":
        result.abort = GuardUnavailable(descriptor.key, shown or reason)
    elif effect == "abort":
        status, code = (500, "hook_failed") if called else (503, "no_worker")
        # the reason (an exception's class and text) goes to the events and the log, not the client
        result.abort = HookError(status, code, f"critical hook {descriptor.key} failed; the request's events say why")
    elif effect == "block":
        block_tool_call(result.data, descriptor.key, reason)
        result.blocked = True
    return effect





def block_tool_call(data: HookData, hook_key: str, reason: str) -> None:
    """Mark the tool call as blocked; the model then sees `tool_result` as the tool's answer."""
    data.set_internal(tool_skipped=True, tool_result=f"Tool call blocked by {hook_key}: {reason}")


class _WrongReturn(TypeError):
    """A hook returned something that is neither HookData nor None, or another lifecycle's HookData."""


def _check_return(returned: object, lifecycle: Lifecycle) -> None:
    """A hook's return must be this stage's HookData: checked here, where every hook runs
    (in-process and in a worker alike), so both refuse the same return with the same error."""
    if not isinstance(returned, HookData):
        raise _WrongReturn(f"returned {type(returned).__name__}, expected HookData or None")
    if returned.lifecycle != lifecycle:
        raise _WrongReturn(f"returned the HookData of {returned.lifecycle}, expected that of {lifecycle}")


async def _call(fn: Callable[..., Any], args: tuple[Any, ...], timeout: float | None, is_async: bool) -> Any:
    if is_async:
        if timeout is None:
            return await fn(*args)
        return await asyncio.wait_for(fn(*args), timeout)
    if timeout is None:
        returned = fn(*args)
        return await returned if inspect.isawaitable(returned) else returned
    # A sync hook can only be bounded in time from outside its thread.
    return await asyncio.wait_for(asyncio.to_thread(fn, *args), timeout)


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


_SCALARS = frozenset({str, int, float, bool, type(None)})


class _NotPlain(Exception):
    """A value the plain walk does not copy (another type, or a container reached twice)."""


def copy_state(state: dict[str, Any]) -> dict[str, Any]:
    """An exact deep copy of `ctx.state`, as `copy.deepcopy` makes it.

    What state holds is mostly JSON (it travels with the request as JSON): dicts and lists
    of str, int, float, bool and None are copied by a plain walk, several times faster
    than deepcopy, which runs on every hook call. Anything else (another type, a subclass,
    a container reached twice, whose sharing deepcopy keeps) makes it fall back to
    deepcopy for the whole state.
    """
    if not state:
        return {}
    try:
        copied: dict[str, Any] = _copy_container(state, set())
        return copied
    except _NotPlain:
        return copy.deepcopy(state)


def _copy_container(value: Any, seen: set[int]) -> Any:
    kind = type(value)
    if (kind is not dict and kind is not list) or id(value) in seen:
        raise _NotPlain
    seen.add(id(value))
    if kind is list:
        return [item if type(item) in _SCALARS else _copy_container(item, seen) for item in value]
    copied = {}
    for key, item in value.items():
        if type(key) not in _SCALARS:
            raise _NotPlain
        copied[key] = item if type(item) in _SCALARS else _copy_container(item, seen)
    return copied


def _restore(data: HookData, saved: dict[str, Any], ctx: Context, saved_state: dict[str, Any]) -> None:
    data.__dict__.update(saved)
    ctx.state.clear()
    ctx.state.update(saved_state)


def _in_words(exc: BaseException, timeout: float | None) -> str:
    """Why a hook failed, as a client may read it (the exception itself stays in the log)."""
    if isinstance(exc, TimeoutError):
        return f"timed out after {timeout}s"
    return "it failed; the request's events say why"


def _describe(exc: BaseException, timeout: float | None) -> str:
    if isinstance(exc, TimeoutError):
        return f"timed out after {timeout}s"
    if isinstance(exc, _WrongReturn):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _outcome(key: str, started: float, outcome: Outcome, error: str | None = None) -> HookOutcome:
    return HookOutcome(key, (time.perf_counter() - started) * 1000, outcome, error)
