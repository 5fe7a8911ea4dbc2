"""Small helpers shared by the built-in skills (configuration, state, logging)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

import structlog

from hookbus.skills.context import Context


def env_list(name: str, default: Iterable[str]) -> list[str]:
    """A comma-separated environment variable as a list; `default` when it is unset.

    An empty (but set) variable gives an empty list, so `NAME=` disables a default list.
    """
    raw = os.environ.get(name)
    if raw is None:
        return [item for item in default if item]
    return split_list(raw)


def split_list(raw: str) -> list[str]:
    return [item.strip() for item in raw.split(",") if item.strip()]


def as_list(value: Iterable[str] | str) -> list[str]:
    """Accept a list of strings or one comma-separated string (never iterate a string's chars)."""
    if isinstance(value, str):
        return split_list(value)
    return [str(item).strip() for item in value if str(item).strip()]


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be a number, got {raw!r}") from exc


def state_section(ctx: Context, key: str) -> dict[str, Any]:
    """This skill's dict in `ctx.state`, created if missing (or replaced if not a dict)."""
    section = ctx.state.get(key)
    if not isinstance(section, dict):
        section = {}
        ctx.state[key] = section
    return section


def read_section(ctx: Context, key: str) -> dict[str, Any]:
    """This skill's dict in `ctx.state` for reading only: `{}` if absent; never creates it."""
    section = ctx.state.get(key)
    return section if isinstance(section, dict) else {}


def sub_dict(section: dict[str, Any], key: str) -> dict[str, Any]:
    value = section.get(key)
    if not isinstance(value, dict):
        value = {}
        section[key] = value
    return value


def logger(name: str, ctx: Context) -> Any:
    """A structlog logger with the request's completion id bound.

    Fetched per call (not cached at import) so it always follows the current structlog
    configuration, including `structlog.testing.capture_logs`.
    """
    return structlog.get_logger(name).bind(completion_id=ctx.completion_id)


def usage_numbers(usage: Any) -> dict[str, int]:
    """prompt/completion/total tokens of a CompletionUsage (or its dict form, or None)."""
    names = ("prompt_tokens", "completion_tokens", "total_tokens")
    if usage is None:
        return dict.fromkeys(names, 0)
    if isinstance(usage, Mapping):
        return {name: int(usage.get(name) or 0) for name in names}
    return {name: int(getattr(usage, name, 0) or 0) for name in names}


def stage_began(ctx: Context) -> float:
    """When the current stage began: an observer runs after it (`ctx.call.stage_started`);
    a hook on the request's path runs in it (now)."""
    return ctx.call.stage_started if ctx.call.stage_started is not None else time.time()


def stage_ended(ctx: Context) -> float:
    """When the current stage ended, for an observer; now, for a hook on the request's path."""
    return ctx.call.stage_ended if ctx.call.stage_ended is not None else time.time()
