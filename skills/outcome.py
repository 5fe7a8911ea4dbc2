"""The one vocabulary for what happened to a hook call or a hop, shared by the runner, the
bus envelopes (replies, monitor records), logs and metrics."""

from __future__ import annotations

import enum


class Outcome(enum.StrEnum):
    """What happened to one hook call (or hop, or request): the one vocabulary of logs,
    events, metrics."""

    OK = "ok"
    FAILED = "failed"
    """It ran and failed: raised, or returned the wrong type (a request: it ended with an error)."""
    HOP_FAILED = "hop_failed"
    """Its hop failed as a whole, so what the hook did is unknown: the worker could not
    run the hop (an unknown hook, unreadable data, dead-lettered) or its reply was unusable."""
    TIMEOUT = "timeout"
    BLOCKED = "blocked"
    """It failed in `before_toolcall`, so the tool call was blocked."""
    ABORTED = "aborted"
    """It raised a HookError, or failed while critical: the run stops."""
    SKIPPED = "skipped"
    """Not called: no live replica in its worker group."""
    EXPIRED = "expired"
    """Its hop reached the worker after the hop's deadline: not run, the caller gave up."""
    DEAD_LETTER = "dead_letter"
    """Its hop was set aside on the dead-letter stream."""
