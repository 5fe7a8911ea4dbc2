"""What a process does between the read that brings a hop and the write that answers it:
event-loop turns and callbacks, hookbus against the raw redis-py floor.

    python -m tests.bench.loop_turns [--kind on_chunk|before_llm_call] [--hops 1000]

The hop bench's floor worker and `hookbus worker` (tests/bench/hop.py) run on the stock
asyncio loop with a tracer loaded into every process (tests/bench/loop_trace); this
process drives c=1 hops to each in turn and prints, per process, the median turns and
callbacks from the socket read that brought a hop (or its reply, on the caller's side)
to the write it led to, and the traced time (the tracer slows everything down: compare
the counts). Not part of `python -m tests.bench`: RESULTS.md quotes its output.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from tests.bench.common import (
    PYTHON,
    REPO,
    bench_env,
    bench_redis,
    new_prefix,
    processes,
    quiet_logs,
)
from tests.bench.floor import FloorCaller
from tests.bench.hop import _ops, noop_group, sizes
from tests.bench.loop_trace_log import hop_cycles, install, read

TRACER = Path(__file__).parent / "loop_trace"


async def drive(redis_url: str, kind: str, hops: int) -> dict[str, tuple[float, float]]:
    """Run the floor's and hookbus's hops one after the other; their time windows."""
    quiet_logs()
    prefix = new_prefix("turns")
    event_bytes, reply_bytes = await sizes(kind)
    windows = {}
    async with processes() as procs:
        env = bench_env(redis_url, prefix)
        floor_stream = f"{prefix}floor"
        procs.spawn([PYTHON, "-m", "tests.bench.floor", redis_url, floor_stream, "floor", "32", str(reply_bytes)], env, "floor")
        side, plan, _ = await noop_group(procs, redis_url, prefix)
        try:
            caller = FloorCaller(redis_url, floor_stream, f"{prefix}floor-replies")
            await caller.start()
            payload = b"x" * event_bytes
            await caller.call(payload, timeout=30)
            ops = _ops(side.runtime, plan.segments(kind, ["chat"])[0], kind, 1, caller, payload)
            for name in ("floor", "hop"):
                for _ in range(200):
                    await ops[name]()
                began = time.perf_counter()
                for _ in range(hops):
                    await ops[name]()
                windows[name] = (began, time.perf_counter())
            await caller.stop()
        finally:
            await side.close()
    return windows


def summary(path: str, window: tuple[float, float]) -> str:
    cycles = hop_cycles(read(path, *window))
    if not cycles:
        return "no hop seen"
    turns = statistics.median(sum(1 for e in c if e[1] == "turn") for c in cycles)
    callbacks = statistics.median(sum(1 for e in c if e[1] == "callback") for c in cycles)
    traced = statistics.median((c[-1][0] - c[0][0]) * 1e6 for c in cycles)
    return f"{turns:4.1f} turns, {callbacks:4.1f} callbacks, {traced:5.0f} us traced (median of {len(cycles)})"


def role(path: str) -> str:
    text = Path(path).read_text()
    if "task serve" in text:
        return "floor worker"
    if "WorkerReplica" in text:
        return "hookbus worker"
    return "caller"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", default="on_chunk", choices=["on_chunk", "before_llm_call"])
    parser.add_argument("--hops", type=int, default=1000)
    args = parser.parse_args()
    out = tempfile.mkdtemp(prefix="hookbus-turns-")
    base = os.path.join(out, "trace")
    os.environ.update(
        HOOKBUS_EVENT_LOOP="asyncio", HOOKBUS_LOOP_TRACE=base,
        PYTHONPATH=os.pathsep.join([str(TRACER), str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    write_log = install(base, at_exit=False)  # this process: the caller of both
    try:
        with bench_redis() as url:
            windows = asyncio.run(drive(url, args.kind, args.hops))
        write_log()
        print(f"[loop turns] {args.kind}, c=1, {args.hops} hops each, from a hop's read to its reply's write:")
        for path in sorted(str(p) for p in Path(out).glob("trace.*")):
            who = role(path)
            if who == "caller":
                for name, label in (("floor", "floor caller"), ("hop", "hookbus caller (BusRuntime.hop)")):
                    print(f"  {label:34s} {summary(path, windows[name])}")
            else:
                print(f"  {who:34s} {summary(path, windows['floor' if who.startswith('floor') else 'hop'])}")
    finally:
        shutil.rmtree(out, ignore_errors=True)

if __name__ == "__main__":
    main()
