"""CPU-heavy steps of a request, off the event loop: a small bounded thread pool.

One request's Python work on a large conversation (parsing and decoding it, the openai
client's per-field transform and JSON encoding, compaction's token counting and copying)
used to hold the orchestrator's event loop for over a minute, and the gateway's for
seconds, and with them every other request.
Such steps run here instead. They still share the GIL with the loop, but the loop gets
its turn every switch interval (5 ms), so other requests, heartbeats and leases go on.
Small inputs stay on the loop: a thread hop costs more than their work.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sized
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

POOL_THREADS = 2
"""Threads for heavy steps; more would only queue on the GIL."""
LARGE_ITEMS = 2000
"""A conversation of at least this many messages is worked on off the loop."""
LARGE_BYTES = 256 * 1024
"""A payload of at least this many bytes is decoded or encoded off the loop."""

_pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="hookbus-cpu")


def is_large(items: Sized | None = None, size: int = 0) -> bool:
    return (items is not None and len(items) >= LARGE_ITEMS) or size >= LARGE_BYTES


async def off_loop(large: bool, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)`, on the pool when `large`, else right here."""
    if not large:
        return fn(*args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_pool, functools.partial(fn, *args, **kwargs))


async def off_loop_async(
    large: bool, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs
) -> T:
    """An async function that is mostly CPU work, on a pool thread's own event loop when
    `large`. Whatever it calls back that belongs to this loop (a Redis or LLM client) must
    be wrapped with `on_this_loop`."""
    if not large:
        return await fn(*args, **kwargs)

    async def run() -> T:
        return await fn(*args, **kwargs)

    return await off_loop(True, asyncio.run, run())


def on_this_loop(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """`fn`, callable from any event loop, always run on the loop that is running now."""
    home = asyncio.get_running_loop()

    @functools.wraps(fn)
    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        if asyncio.get_running_loop() is home:
            return await fn(*args, **kwargs)
        future: Any = asyncio.run_coroutine_threadsafe(_awaited(fn(*args, **kwargs)), home)
        return await asyncio.wrap_future(future)

    return call


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable
