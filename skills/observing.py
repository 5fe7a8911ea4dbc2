"""How observers (`@hook(..., observe=True)`) are called: one rule for in-process
observers and for observers in a worker group.

An observer runs after its stage, off the request's path, with the stage's data as the
stage ended (what the next step started from). Around each call:

- `ctx.state` is the request's state as the stage ended, plus what the request's
  observers (of this process or group) wrote to it at earlier stages of the same request
  (top-level keys; theirs win): an observer that stamps a start time at on_connection
  finds it at finalize_connection. What observers write never reaches the request's own
  hooks.
- `ctx.call.stage_started` / `ctx.call.stage_ended` say when the stage ran (an observer
  runs later, so `time.time()` is not the stage's time).
- What it returns is ignored; what it raises (a HookError too) is logged and recorded
  as its outcome, and the next observer still runs. Each observer goes through the
  runner's `run_hooks` alone, so timeouts and the undoing of a failed call's state are
  the same as for any hook.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from hookbus.skills.context import Context
from hookbus.skills.data import HookData
from hookbus.skills.runner import HookOutcome, copy_state, run_hooks
from hookbus.skills.skill import BoundHook

log = structlog.get_logger("hookbus.observers")

_MISSING = object()


@dataclass(slots=True)
class StageSeen:
    """One stage as its observers get it: the data and the request's `ctx.state` as the
    stage ended (neither is changed here), and when the stage began and ended."""

    data: HookData
    state: dict[str, Any]
    stage_key: str
    started: float
    ended: float


@dataclass(slots=True)
class ObserverMemory:
    """What one request's observers wrote to `ctx.state`, carried from stage to stage."""

    written: dict[str, Any] = field(default_factory=dict)

    def state_for(self, request_state: dict[str, Any]) -> dict[str, Any]:
        """The state an observer sees: the request's, with the observers' own on top."""
        if not self.written:
            return copy_state(request_state)
        return {**copy_state(request_state), **copy_state(self.written)}

    def keep(self, request_state: dict[str, Any], seen: dict[str, Any]) -> None:
        """Remember the top-level keys the observers set or changed in `seen`."""
        for key, value in seen.items():
            if key in self.written or request_state.get(key, _MISSING) != value:
                self.written[key] = value


async def observe_stage(
    hooks: Sequence[BoundHook],
    stage: StageSeen,
    ctx: Context,
    memory: ObserverMemory,
    *,
    attempt: int = 1,
) -> list[HookOutcome]:
    """Call each observer of one stage in order (see the module docstring); `ctx` is the
    request's context for observers (its `state` and `call` are set here). Never raises
    for an observer's failure."""
    ctx.state = memory.state_for(stage.state)
    call = ctx.call
    call.stage_started, call.stage_ended = stage.started, stage.ended
    outcomes: list[HookOutcome] = []
    for bound in hooks:
        result = await run_hooks((bound,), stage.data, ctx, stage_key=stage.stage_key, attempt=attempt)
        if result.abort is not None and stage.data.lifecycle != "finalize_connection":
            log.warning(
                "observer_raised", hook=bound.key, lifecycle=stage.data.lifecycle,
                error=result.abort.message, completion_id=ctx.completion_id,
                hint="an observer cannot abort the request; declare it without observe=True to stop requests",
            )
        outcomes += result.outcomes
    memory.keep(stage.state, ctx.state)
    return outcomes

