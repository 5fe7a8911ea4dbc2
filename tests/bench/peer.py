"""Bench 2, the peer: a chain of 3 remote no-op hooks over a `before_llm_call` (20
messages, two tools) done with FastStream's own request/reply against hookbus.

- FastStream 0.7: `await broker.request(payload, stream=...)` three times in a row, each
  with the previous reply's body (tests.bench.peer_worker: three idiomatic subscribers
  returning their body). Each request opens a pub/sub connection, SUBSCRIBEs a fresh
  reply channel, XADDs, waits for the PUBLISHed reply, unsubscribes: its connections
  come from the broker's pool (redis-py's default: 100, non-blocking), so at high
  concurrency it fails with "Too many connections"; those failures are counted.
- hookbus, 3 hooks in one worker group: the chain runs in one hop (one round trip).
- hookbus, 3 hooks in 3 groups: three hops, the like-for-like transport comparison, as
  the orchestrator's stage runs them (BusRuntime.hop_segments: each worker sends the
  stage on to the next group, hookbus.bus.hops.send_on), and hop by hop from the caller
  (BusRuntime.hop per segment), the baseline of what routes save: the same workers, the
  two taking turns in rounds.
The hookbus cases run `hookbus worker` replicas (--concurrency 32).

Run alone: `python -m tests.bench.peer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from tests.bench import payloads
from tests.bench.common import (
    PYTHON,
    Row,
    Stats,
    bench_env,
    bus_side,
    new_prefix,
    processes,
    quiet_logs,
    run_alone,
    run_load,
    scaled,
    wait_for_replicas,
)

CONCURRENCIES = (1, 32, 128)
ROUNDS = 3
"""Rounds of each concurrency, the two ways of running the 3-group chain in turn."""
CHAIN = ["tests.bench.skills:Chain1", "tests.bench.skills:Chain2", "tests.bench.skills:Chain3"]


async def faststream_chain(redis_url: str, prefix: str, procs: Any) -> dict[int, Stats]:
    from faststream.redis import RedisBroker

    procs.spawn([PYTHON, "-m", "tests.bench.peer_worker", redis_url, prefix], bench_env(redis_url, prefix), "peer")
    broker = RedisBroker(redis_url)
    await broker.connect()
    body = {"data": payloads.before_llm_call_data().model_dump(mode="json"), "ctx": payloads.context().model_dump(mode="json")}

    async def chain() -> None:
        current: Any = body
        for n in (1, 2, 3):
            reply = await broker.request(current, stream=f"{prefix}peer:{n}", timeout=10)
            current = json.loads(reply.body)

    deadline = time.monotonic() + 60
    while True:  # until the three subscribers are up
        procs.check_alive()
        try:
            await chain()
            break
        except Exception:  # noqa: BLE001
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    results = {}
    try:
        for concurrency in CONCURRENCIES:
            total = scaled(300 if concurrency == 1 else 1500)
            results[concurrency] = await run_load(chain, concurrency=concurrency, total=total, warmup=scaled(30), max_seconds=40)
    finally:
        await broker.stop()
    return results


async def hookbus_chains(
    redis_url: str, prefix: str, procs: Any, groups: dict[str, list[str]], *, routed: bool = True
) -> dict[str, dict[int, Stats]]:
    """The chain hop by hop from the caller (BusRuntime.hop per segment), and, with
    `routed`, as the orchestrator's stage runs it (BusRuntime.hop_segments: each worker
    sends the stage on to the next group) on the same workers, the two taking turns in
    rounds, so the machine's drift hits both."""
    from hookbus.services.orchestrator.loop.plan import HookPlan

    for group, skills in groups.items():
        procs.worker(redis_url, prefix, group, skills, concurrency=32)
    side = await bus_side(redis_url, prefix)
    await wait_for_replicas(redis_url, prefix, dict.fromkeys(groups, 1), procs)
    runtime = side.runtime
    await runtime.registry.refresh()
    plan = HookPlan.build([], [], runtime.remote_hooks(), runtime.remote_tools())
    segments = plan.segments("before_llm_call", ["chat"])
    assert sum(len(s.hooks) for s in segments) == 3, segments
    contexts = [payloads.context() for _ in range(max(CONCURRENCIES))]
    turn = iter(range(1 << 62))

    def record(ctx: Any, segment: Any, result: Any, began: float) -> None:
        runtime.record_stage(ctx.completion_id, "before_llm_call", segment.group, result.outcomes, (time.perf_counter() - began) * 1000)
        if any(o.outcome != "ok" for o in result.outcomes):
            raise RuntimeError(result.outcomes[0].error)

    async def sent_on() -> None:
        ctx = contexts[next(turn) % len(contexts)]
        began = time.perf_counter()
        chain = runtime.hop_segments(segments, payloads.before_llm_call_data(), ctx, "before_llm_call#0")
        async with contextlib.aclosing(chain) as results:
            position = 0
            async for result in results:
                record(ctx, segments[position], result, began)
                position, began = position + 1, time.perf_counter()

    async def hop_by_hop() -> None:
        ctx = contexts[next(turn) % len(contexts)]
        data = payloads.before_llm_call_data()
        began = time.perf_counter()
        for segment in segments:
            result = await runtime.hop(segment, data, ctx, "before_llm_call#0")
            record(ctx, segment, result, began)
            data, began = result.data, time.perf_counter()

    drives = {"sent on": sent_on, "hop by hop": hop_by_hop} if routed else {"hop by hop": hop_by_hop}
    results: dict[str, dict[int, Stats]] = {name: {} for name in drives}
    try:
        for concurrency in CONCURRENCIES:
            total = scaled(300 if concurrency == 1 else 1500) // ROUNDS
            rounds: dict[str, list[Stats]] = {name: [] for name in drives}
            for _ in range(ROUNDS):
                for name, drive in drives.items():
                    rounds[name].append(await run_load(
                        drive, concurrency=concurrency, total=total, warmup=scaled(30) // ROUNDS,
                        max_seconds=40 / ROUNDS,
                    ))
            for name, parts in rounds.items():
                results[name][concurrency] = Stats.merged(parts)
    finally:
        await side.close()
    return results


async def measure(redis_url: str) -> list[Row]:
    quiet_logs()
    rows: list[Row] = []
    async with processes() as procs:
        fs = await faststream_chain(redis_url, new_prefix("peer-fs"), procs)
        one = (await hookbus_chains(redis_url, new_prefix("peer-one"), procs, {"chain": CHAIN}, routed=False))["hop by hop"]
        three_groups = {f"c{n}": [skill] for n, skill in enumerate(CHAIN, 1)}
        chains = await hookbus_chains(redis_url, new_prefix("peer-three"), procs, three_groups)
        three, hop_by_hop = chains["sent on"], chains["hop by hop"]
    print("\n[peer] chain of 3 no-op hooks over a before_llm_call (20 messages)")
    for concurrency in CONCURRENCIES:
        print(fs[concurrency].line(f"FastStream broker.request() x3 c={concurrency}", "chains/s"))
        print(one[concurrency].line(f"hookbus, 1 group (1 hop) c={concurrency}", "chains/s"))
        print(three[concurrency].line(f"hookbus, 3 groups (3 hops, sent on) c={concurrency}", "chains/s"))
        print(hop_by_hop[concurrency].line(f"hookbus, 3 groups (3 hops, hop by hop) c={concurrency}", "chains/s"))
    for concurrency in CONCURRENCIES:
        base = fs[concurrency]
        for label, stats in (("1 group/1 hop", one[concurrency]), ("3 groups/3 hops", three[concurrency])):
            case = f"c={concurrency} {label}"
            # "at least 3x faster than broker.request() at p50": FastStream p50 / hookbus p50
            rows.append(Row("peer", f"{case} p50", stats.p50_ms, "ms", base.p50_ms, "FastStream"))
            rows.append(Row("peer", f"{case} speed-up at p50", base.p50_ms / stats.p50_ms, "x faster",
                            target=">=3" if concurrency <= 32 else ""))
            if concurrency > 1:
                rows.append(Row("peer", f"{case} throughput", stats.rate, "chains/s", base.rate, "FastStream"))
            rows.append(Row("peer", f"{case} failures", stats.failures, "of " + str(stats.count + stats.failures), target="<=0"))
        routed, alone = three[concurrency], hop_by_hop[concurrency]
        rows.append(Row("peer", f"c={concurrency} 3 groups sent on p50", routed.p50_ms, "ms", alone.p50_ms, "hop by hop"))
        if concurrency > 1:
            rows.append(Row("peer", f"c={concurrency} 3 groups sent on throughput", routed.rate, "chains/s", alone.rate, "hop by hop"))
        rows.append(
            Row("peer", f"c={concurrency} FastStream failures", base.failures, "of " + str(base.count + base.failures),
                note=", ".join(f"{k}: {v}" for k, v in base.errors.items()))
        )
        if base.errors:
            print(f"  FastStream errors at c={concurrency}: {base.errors}")
    return rows


if __name__ == "__main__":
    run_alone(measure, "peer: FastStream request/reply")
