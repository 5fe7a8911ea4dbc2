"""What each fix of the hop path gains, measured side by side in one run.

Every worker variant runs at once in its own process on its own group (same HopNoop
skill), so the variants take turns on the same machine state; rounds alternate between
them and pool the latencies, which evens out background noise:

  A  today: `hookbus worker` (FastStream dispatch) + BusRuntime/ReplyRouter
  B  A with the FastStream handler free of `Context("message")` injection
     (experiments/faststream_fix.py: no thread-pool round trip per hop)
  C  lean XREADGROUP loop instead of FastStream dispatch, one pipeline per reply
     (experiments/lean_worker.py --no-batch), orchestrator as today
  D  C + replies of one loop turn batched (one pipeline, one multi-id XACK)
  E  D + split wire format on both sides (experiments/codec.py, fast_runtime.py):
     data/ctx dumped and validated once, unchanged data not sent back
  F  E without monitor records on either side (prices the EventWriter)

    python -m tests.bench.experiments.hop_matrix

Written before fixes 1-3 went into the real modules (RESULTS.md). Since then `hookbus
worker` is the XREADGROUP loop with batched replies and BusRuntime sends the split
format, so A is today's code (about E), "classic" hops are split too (C and D measure
the lean worker answering split hops), and B is FastStream's dispatch with the
current reply path; the matrix is kept to re-measure those variants side by side.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tests.bench import payloads
from tests.bench.common import (
    PYTHON,
    Row,
    Stats,
    bench_env,
    bench_redis,
    bus_side,
    cpu_seconds,
    merge,
    new_prefix,
    print_rows,
    processes,
    quiet_logs,
    redis_pid,
    run_load,
    scaled,
    wait_for_replicas,
)
from tests.bench.experiments.fast_runtime import fast_bus_side
from tests.bench.floor import FloorCaller

SKILL = "tests.bench.skills:HopNoop"
WORKERS = {
    # group: command after PYTHON -m
    "fs": None,  # the real `hookbus worker`
    "fsfix": ["tests.bench.experiments.faststream_fix"],
    "leannb": ["tests.bench.experiments.lean_worker", "--no-batch"],
    "lean": ["tests.bench.experiments.lean_worker"],
    "leannoev": ["tests.bench.experiments.lean_worker", "--no-events"],
}
VARIANTS = [
    # label, group, runtime, record_stage
    ("A hookbus worker (read loop, batched, split)", "fs", "classic", True),
    ("B FastStream, no Context injection", "fsfix", "classic", True),
    ("C lean XREADGROUP loop", "leannb", "classic", True),
    ("D C + batched replies", "lean", "classic", True),
    ("E D + split wire format", "lean", "fast", True),
    ("F E without monitor records", "leannoev", "fast", False),
]


async def measure(redis_url: str, rounds: int = 3) -> list[Row]:
    quiet_logs()
    prefix = new_prefix("matrix")
    rows: list[Row] = []
    async with processes() as procs:
        env = bench_env(redis_url, prefix)
        pids: dict[str, int] = {}
        for group, module in WORKERS.items():
            if module is None:
                child = procs.worker(redis_url, prefix, group, [SKILL], concurrency=32)
            else:
                child = procs.spawn([PYTHON, "-m", *module[:1], "--group", group, SKILL, "--concurrency", "32", *module[1:]], env, group)
            pids[group] = child.pid
        server_pid = redis_pid(redis_url)
        floor_stream = f"{prefix}floor"
        classic = await bus_side(redis_url, prefix)
        fast = await fast_bus_side(redis_url, prefix)
        await wait_for_replicas(redis_url, prefix, dict.fromkeys(WORKERS, 1), procs)
        from hookbus.services.orchestrator.plan import HookPlan

        sides = {"classic": classic.runtime, "fast": fast.runtime}
        for runtime in sides.values():
            await runtime.registry.refresh()
        try:
            for kind in payloads.KINDS:
                from tests.bench.hop import sizes

                event_bytes, reply_bytes = await sizes(kind)
                floor_proc = procs.spawn(
                    [PYTHON, "-m", "tests.bench.floor", redis_url, floor_stream, f"floor-{kind}", "32", str(reply_bytes)],
                    env, "floor",
                )
                caller = FloorCaller(redis_url, floor_stream, f"{prefix}floor-replies-{kind}")
                await caller.start()
                request = b"x" * event_bytes
                await caller.call(request, timeout=30)
                ops: dict[str, Callable[[], Awaitable[Any]]] = {"floor": functools.partial(caller.call, request)}
                op_pid = {"floor": floor_proc.pid}
                for label, group, side, record in VARIANTS:
                    op_pid[label] = pids[group]
                    runtime = sides[side]
                    plan = HookPlan.build([], [], runtime.remote_hooks(), runtime.remote_tools())
                    segment = next(s for s in plan.segments(kind, ["chat"]) if s.group == group)
                    ops[label] = _hop_op(runtime, segment, kind, record)
                print(f"\n[matrix] {kind}")
                for concurrency in (1, 32):
                    total = scaled(600 if concurrency == 1 else 2000)
                    results: dict[str, list[Stats]] = {name: [] for name in ops}
                    cpu: dict[str, list[float]] = {name: [0.0, 0.0, 0.0] for name in ops}
                    for _ in range(rounds):
                        for name, op in ops.items():
                            await run_load(op, concurrency=concurrency, total=scaled(100))
                            before = (time.process_time(), cpu_seconds(op_pid[name]), cpu_seconds(server_pid))
                            results[name].append(await run_load(op, concurrency=concurrency, total=total))
                            after = (time.process_time(), cpu_seconds(op_pid[name]), cpu_seconds(server_pid))
                            for i in range(3):
                                cpu[name][i] += after[i] - before[i]
                    pooled = {name: merge(parts) for name, parts in results.items()}
                    floor = pooled["floor"]
                    for name, stats in pooled.items():
                        per_hop = [c / max(stats.count, 1) * 1e6 for c in cpu[name]]
                        print(stats.line(f"{name} c={concurrency}", "hops/s")
                              + f"  cpu/hop us: caller {per_hop[0]:.0f} worker {per_hop[1]:.0f} redis {per_hop[2]:.0f}")
                        if name == "floor":
                            continue
                        if concurrency == 1:
                            rows.append(Row("fixes", f"{kind} c=1 p50 {name}", stats.p50_ms, "ms", floor.p50_ms, "floor", "<=1.3x"))
                        else:
                            floor_cpu = [c / max(floor.count, 1) * 1e6 for c in cpu["floor"]]
                            rows.append(Row("fixes", f"{kind} c=32 thr {name}", stats.rate, "hops/s", floor.rate, "floor", ">=0.7x"))
                            rows.append(Row("fixes", f"{kind} c=32 worker CPU/hop {name}", per_hop[1], "us",
                                            floor_cpu[1], "floor worker"))
                            rows.append(Row("fixes", f"{kind} c=32 caller CPU/hop {name}", per_hop[0], "us",
                                            floor_cpu[0], "floor caller"))
                await caller.stop()
                floor_proc.terminate()
        finally:
            await classic.close()
            await fast.close()
    return rows


def _hop_op(runtime: Any, segment: Any, kind: str, record: bool) -> Callable[[], Awaitable[None]]:
    data = payloads.KINDS[kind]()
    ctxs = [payloads.context() for _ in range(64)]
    turn = iter(range(1 << 62))

    async def op() -> None:
        ctx = ctxs[next(turn) % 64]
        began = time.perf_counter()
        result = await runtime.hop(segment, data, ctx, kind)
        if record:
            runtime.record_stage(ctx, kind, segment.group, result.outcomes, (time.perf_counter() - began) * 1000)
        if result.outcomes[0].outcome != "ok":
            raise RuntimeError(result.outcomes[0].error)

    return op


async def main() -> list[Row]:
    with bench_redis() as url:
        rows = await measure(url)
    print_rows("hop path fixes (experiments)", rows)
    return rows


if __name__ == "__main__":
    asyncio.run(main())
