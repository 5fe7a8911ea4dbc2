"""The loop tracer of tests/bench/loop_turns.py: wraps the stock asyncio loop's callback
runner, its selector and its socket transport's reads and writes, and logs each as
(time, kind, name); `install` writes the log to `<path>.<pid>` when the process exits."""

from __future__ import annotations

import asyncio
import asyncio.events
import asyncio.selector_events
import atexit
import os
import selectors
import time
from collections.abc import Callable
from typing import Any

Entry = tuple[float, str, str]


def install(path: str, *, at_exit: bool = True) -> Callable[[], None]:
    """Trace this process from now on; returns the function that writes the log (run at
    exit too, unless `at_exit` is False)."""
    log: list[Entry] = []
    clock = time.perf_counter  # CLOCK_MONOTONIC: one clock for every process of the run
    run = asyncio.events.Handle._run

    def traced_run(handle: Any) -> None:
        callback = handle._callback
        owner = getattr(callback, "__self__", None)
        if isinstance(owner, asyncio.Task):
            name = "task " + getattr(owner.get_coro(), "__qualname__", "?")
        else:
            name = getattr(callback, "__qualname__", type(callback).__name__)
        log.append((clock(), "callback", name))
        run(handle)

    transport = asyncio.selector_events._SelectorSocketTransport
    write, writelines, received = transport.write, transport.writelines, transport._read_ready__data_received

    def traced_write(self: Any, data: Any) -> None:
        log.append((clock(), "write", ""))
        write(self, data)

    def traced_writelines(self: Any, lines: Any) -> None:
        log.append((clock(), "write", ""))
        writelines(self, lines)

    def traced_received(self: Any) -> None:
        log.append((clock(), "read", ""))
        received(self)

    select = selectors.EpollSelector.select

    def traced_select(self: Any, timeout: float | None = None) -> Any:
        ready = select(self, timeout)
        log.append((clock(), "turn", ""))
        return ready

    asyncio.events.Handle._run = traced_run  # type: ignore[method-assign]
    transport.write = traced_write  # type: ignore[method-assign]
    transport.writelines = traced_writelines  # type: ignore[method-assign]
    transport._read_ready__data_received = traced_received  # type: ignore[method-assign]
    selectors.EpollSelector.select = traced_select  # type: ignore[method-assign]

    def dump() -> None:
        with open(f"{path}.{os.getpid()}", "w") as out:
            out.writelines(f"{t:.6f}\t{kind}\t{name}\n" for t, kind, name in log)

    if at_exit:
        atexit.register(dump)
    return dump


def read(path: str, start: float, end: float) -> list[Entry]:
    entries = []
    with open(path) as source:
        for line in source:
            t, kind, name = line.rstrip("\n").split("\t")
            if start <= float(t) <= end:
                entries.append((float(t), kind, name))
    return entries


def hop_cycles(entries: list[Entry]) -> list[list[Entry]]:
    """From the last socket read before each write to that write: what a process does
    between what brought a hop (or its reply) and the write it leads to."""
    cycles, last_read = [], None
    for i, (_, kind, _) in enumerate(entries):
        if kind == "read":
            last_read = i
        elif kind == "write" and last_read is not None:
            cycles.append(entries[last_read : i + 1])
            last_read = None
    return cycles
