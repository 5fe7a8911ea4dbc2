"""RequestLogger: one structured log line per request, on every path."""

from __future__ import annotations

import os

from hookbus.skills.builtin._common import (
    logger,
    read_section,
    stage_began,
    stage_ended,
    state_section,
    usage_numbers,
)
from hookbus.skills.context import Context
from hookbus.skills.data import HookData
from hookbus.skills.decorators import hook
from hookbus.skills.skill import Skill

STATE_KEY = "request_logger"
LOGGER_NAME = "hookbus.skills.request_logger"
LEVELS = ("debug", "info", "warning", "error")


class RequestLogger(Skill):
    """Logs one `request_completed` line per request.

    Both hooks are observers (`observe=True`): no request waits for the log line, and
    what they keep in `ctx.state["request_logger"]` is the observers' own (blocking hooks
    of the request do not see it; hookbus.skills.observing).

    - `on_connection` (priority 0) stores the wall-clock time the request's first stage
      began (so it still means something when finalize runs on another replica) and the
      caller in `ctx.state["request_logger"]`.
    - `finalize_connection` (priority 100) logs: `completion_id`, `agent`, `model`,
      `caller`, `session_id`, `duration_ms`, `prompt_tokens`, `completion_tokens`,
      `total_tokens`, `outcome` (`"ok"` or e.g. `"402 payment_required"`), `status_code`,
      `error_code`, `messages` (message count); `duration_ms` ends when the finalize
      stage ended; plus `recovery=True` when another
      orchestrator finalized the request. When `on_connection` never ran (a
      higher-priority hook refused the request) `duration_ms` is None and the usage is 0.
      It logs at most once per request state (a second call with the same state is a
      no-op); a redelivered finalize on another replica carries `attempt` > 1.

    Configuration:
        level: log level of successful requests; env `HOOKBUS_REQUEST_LOG_LEVEL`,
            default "info".
        error_level: log level of failed requests (default "warning").
    """

    name = "request-logger"

    def __init__(self, *, level: str | None = None, error_level: str = "warning") -> None:
        self.level = _level(level or os.environ.get("HOOKBUS_REQUEST_LOG_LEVEL") or "info")
        self.error_level = _level(error_level)

    @hook("on_connection", 0, observe=True)
    async def start(self, data: HookData, ctx: Context) -> None:
        state = state_section(ctx, STATE_KEY)
        state.setdefault("started", stage_began(ctx))
        state.setdefault("caller", ctx.auth.peer_user_id)
        state.setdefault("stream", bool(data.stream))

    @hook("finalize_connection", 100, observe=True)
    async def log_request(self, data: HookData, ctx: Context) -> None:
        state = read_section(ctx, STATE_KEY)
        if state.get("logged"):
            return
        started = state.get("started")
        duration_ms = None
        if isinstance(started, int | float):
            duration_ms = round(max(0.0, stage_ended(ctx) - started) * 1000, 2)
        error = data.error
        fields = {
            "agent": ctx.metadata.agent_name,
            "model": ctx.metadata.model,
            "caller": state.get("caller", ctx.auth.peer_user_id),
            "session_id": ctx.session.id,
            "duration_ms": duration_ms,
            **usage_numbers(data.usage),
            "outcome": "ok" if error is None else f"{error.status_code} {error.code}",
            "status_code": 200 if error is None else error.status_code,
            "error_code": None if error is None else error.code,
            "messages": len(data.messages or []),
        }
        if ctx.recovery:
            fields["recovery"] = True
        if ctx.call.attempt > 1:
            fields["attempt"] = ctx.call.attempt
        log = logger(LOGGER_NAME, ctx)
        getattr(log, self.level if error is None else self.error_level)(
            "request_completed", **fields
        )
        state_section(ctx, STATE_KEY)["logged"] = True


def _level(name: str) -> str:
    level = name.strip().lower()
    if level == "warn":
        level = "warning"
    if level not in LEVELS:
        raise ValueError(f"unknown log level {name!r}; use one of {', '.join(LEVELS)}")
    return level
