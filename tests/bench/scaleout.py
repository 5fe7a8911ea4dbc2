"""Bench 5, scale-out: an I/O-bound hook (tests.bench.skills:Sleeper, waits 20 ms) served
by 1, 2, 4 and 8 replicas of one worker group, each `hookbus worker --concurrency 4`, so
one replica serves at most 4 / 20 ms = 200 hops/s and only more replicas add capacity.

Replicas are added between steps (1, +1, +2, +4) to the same group. The load is
BusRuntime.hop of an on_chunk segment from this process with 2 x (replicas x 4) hops in
flight, so there is always work queued for every replica. Efficiency = throughput(n) /
(n x throughput(1)); the ideal (n x 4 / 20 ms) is printed alongside.

Run alone: `python -m tests.bench.scaleout`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tests.bench import payloads
from tests.bench.common import (
    Row,
    bus_side,
    cpu_seconds,
    new_prefix,
    processes,
    quiet_logs,
    redis_pid,
    run_alone,
    run_load,
    scaled,
    wait_for_replicas,
)

GROUP = "sleepy"
PER_REPLICA = 4
HOOK_SECONDS = 0.02
STEPS = (1, 2, 4, 8)


def _hop(runtime, segment):  # type: ignore[no-untyped-def]
    data = payloads.on_chunk_data()
    contexts = [payloads.context() for _ in range(64)]
    turn = iter(range(1 << 62))

    async def hop() -> None:
        ctx = contexts[next(turn) % 64]
        began = time.perf_counter()
        result = await runtime.hop(segment, data, ctx, "on_chunk")
        runtime.record_stage(ctx.completion_id, "on_chunk", GROUP, result.outcomes, (time.perf_counter() - began) * 1000)
        if result.outcomes[0].outcome != "ok":
            raise RuntimeError(result.outcomes[0].error)

    return hop


async def measure(redis_url: str, steps: Sequence[int] = STEPS, label: str = "hookbus") -> list[Row]:
    quiet_logs()
    prefix = new_prefix("scale")
    rates: dict[int, float] = {}
    rows: list[Row] = []
    async with processes() as procs:
        side = await bus_side(redis_url, prefix)
        runtime = side.runtime
        server = redis_pid(redis_url)
        from hookbus.services.orchestrator.loop.plan import HookPlan

        try:
            running = 0
            for n in steps:
                while running < n:
                    running += 1
                    procs.worker(redis_url, prefix, GROUP, ["tests.bench.skills:Sleeper"],
                                 concurrency=PER_REPLICA, replica=f"sleepy-{running}")
                await wait_for_replicas(redis_url, prefix, {GROUP: n}, procs)
                await runtime.registry.refresh()
                plan = HookPlan.build([], [], runtime.remote_hooks(), runtime.remote_tools())
                segment = plan.segments("on_chunk", ["chat"])[0]
                hop = _hop(runtime, segment)

                concurrency = 2 * n * PER_REPLICA
                ideal = n * PER_REPLICA / HOOK_SECONDS
                await run_load(hop, concurrency=concurrency, total=concurrency * 2)
                pids = [child.pid for child in procs.children]
                before = (time.process_time(), sum(cpu_seconds(p) for p in pids), cpu_seconds(server))
                stats = await run_load(hop, concurrency=concurrency, total=int(ideal * (0.6 if scaled(5) == 1 else 3)),
                                       max_seconds=20)
                after = (time.process_time(), sum(cpu_seconds(p) for p in pids), cpu_seconds(server))
                busy = [(a - b) / stats.wall * 100 for a, b in zip(after, before, strict=True)]
                rates[n] = stats.rate
                print(stats.line(f"{label} {n} replica(s), {concurrency} in flight", "hops/s")
                      + f"  ideal {ideal:.0f}/s  cpu%: caller {busy[0]:.0f} replicas {busy[1]:.0f} redis {busy[2]:.0f}")
                efficiency = stats.rate / (n * rates[steps[0]] / steps[0])
                rows.append(Row("scale-out", f"{label} {n} replicas throughput", stats.rate, "hops/s",
                                ideal, "ideal n*4/20ms"))
                if n != steps[0]:
                    rows.append(Row("scale-out", f"{label} {n} replicas efficiency vs linear",
                                    efficiency * 100, "%", target=">=85" if n == 8 else ""))
                if stats.failures:
                    rows.append(Row("scale-out", f"{label} {n} replicas failures", stats.failures, "count",
                                    note=str(stats.errors)))
        finally:
            await side.close()
    return rows


if __name__ == "__main__":
    run_alone(measure, "scale-out")
