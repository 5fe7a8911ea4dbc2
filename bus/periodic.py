"""Background work every few seconds (heartbeats, claims, leases, trimming) that never dies.

One loop for all of it: sleep, check the condition, do one round; a Redis error is logged
(and reported as trouble), anything else is logged with its traceback, and the loop goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from bus.connection import RECONNECT_ERRORS

log = structlog.get_logger("hookbus.periodic")


async def repeat(
    interval: float,
    once: Callable[[], Awaitable[object]],
    *,
    what: str,
    when: Callable[[], bool] | None = None,
    on_trouble: Callable[[], None] | None = None,
) -> None:
    """Run `once` every `interval` seconds (when `when()` allows) until cancelled."""
    while True:
        await asyncio.sleep(interval)
        if when is not None and not when():
            continue
        try:
            await once()
        except RECONNECT_ERRORS as exc:
            if on_trouble is not None:
                on_trouble()
            log.warning(f"{what}_failed", error=str(exc))
        except Exception:  # noqa: BLE001 - background work must survive anything
            log.exception(f"{what}_failed")
