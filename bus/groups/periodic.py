"""Background work every few seconds (heartbeats, claims, leases, trimming) that never dies.

One loop for all of it: sleep, check the condition, do one round; a Redis error is logged
(and reported as trouble), anything else is logged with its traceback, and the loop goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from hookbus.bus.connection.retrying import RECONNECT_ERRORS, out_of_memory

log = structlog.get_logger("hookbus.periodic")


async def repeat(
    interval: float,
    once: Callable[[], Awaitable[object]],
    *,
    what: str,
    when: Callable[[], bool] | None = None,
    on_trouble: Callable[[], None] | None = None,
) -> None:
    """Run `once` every `interval` seconds (when `when()` allows) until cancelled.

    Redis being unreachable or out of memory is logged once when it starts and once when
    it ends (not once per round); anything else with its traceback."""
    failing = False
    while True:
        await asyncio.sleep(interval)
        if when is not None and not when():
            continue
        try:
            await once()
        except Exception as exc:  # noqa: BLE001 - background work must survive anything
            if not (isinstance(exc, RECONNECT_ERRORS) or out_of_memory(exc)):
                log.exception(f"{what}_failed")
                continue
            if on_trouble is not None:
                on_trouble()
            if not failing:
                log.warning(f"{what}_failed", error=str(exc))
                failing = True
            continue
        if failing:
            log.info(f"{what}_recovered")
            failing = False


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None, timeout: float = 5.0) -> None:
    """Cancel background tasks and wait until they are done, at most `timeout` seconds.

    The cancel is repeated: redis-py can swallow a cancellation that lands inside a read
    (and go on blocking), so one cancel is not enough to stop a loop reading Redis.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pending = {t for t in tasks if t is not None and not t.done()}
    while pending and loop.time() < deadline:
        for task in pending:
            task.cancel()
        _done, pending = await asyncio.wait(pending, timeout=0.1)
    if pending:
        log.warning("tasks_not_stopped", tasks=[t.get_name() for t in pending])
