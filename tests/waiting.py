"""The one way tests wait: poll a condition until it holds, instead of sleeping and hoping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any


async def wait_for(
    condition: Callable[[], Awaitable[Any]], timeout: float = 10.0, every: float = 0.05
) -> Any:
    """Await `condition()` until it returns something truthy; returns that, or the last value
    once `timeout` seconds have passed, so the caller's assert shows what was there."""
    deadline = time.monotonic() + timeout
    while True:
        value = await condition()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(every)
