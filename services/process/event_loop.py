"""The event loop the orchestrator and the workers run on: uvloop where it is installed.

A hop is CPU-bound on both sides on a small machine (the wake-up, the socket write, the
callbacks around them; see tests/bench/RESULTS.md), and uvloop's libuv loop spends less
Python per wake-up than the stock selector loop. `HOOKBUS_EVENT_LOOP=asyncio` keeps the
stock loop (to compare, or where uvloop misbehaves). The gateway stays on the stock loop:
its edge handling (hookbus.services.gateway.connections) relies on how that loop retries
a failed accept().
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from hookbus.bus.settings import get_settings

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory, or None for the stock loop (asked for, or uvloop absent)."""
    if get_settings().event_loop == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:  # not built for this platform (Windows): the stock loop
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
