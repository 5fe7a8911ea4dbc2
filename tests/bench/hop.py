"""Bench 1, the hop floor: one remote no-op hook hop against raw redis-py, worker side in
a second process in both cases.

- floor: tests.bench.floor (XADD -> XREADGROUP in a second process -> pipelined reply
  XADD + XACK -> XREAD by one reader task), carrying exactly as many bytes as the
  hookbus hop does each way;
- hookbus: a real `hookbus worker` replica (FastStream, --concurrency 32) hosting
  tests.bench.skills:HopNoop; the orchestrator side is BusRuntime built as
  OrchestratorService builds it, driven through `BusRuntime.hop(segment, data, ctx)` +
  `record_stage` (what the loop's stage runner does per remote segment), with a realistic HopEvent:
  `on_chunk` (a ChatCompletionChunk, ~1.1 kB event) and `before_llm_call` (a 20-message
  conversation and two tools, ~6.7 kB event);
- hookbus router: the same hops through `ReplyRouter.call` with a prebuilt HopEvent
  (no HookData/Context dumps, no reply applied): the transport share of the cost;
- hookbus TypeScript worker: the same hops (`BusRuntime.hop`) to a `hookbus-worker`
  replica (skills/typescript, Node.js, --concurrency 32) hosting the same no-op hooks
  (tests/typescript/skills/bench_noop.ts), beside the Python worker: the per-hop cost of
  the TypeScript worker against the Python one; left out, saying why, without node or
  the built package (`make ts-deps`);
- one flush of the hop path's writers (a reply XADD and an XACK in one write, in this
  process, alternating): hookbus.bus.connection.pipeline against redis-py's own pipeline,
  CPU per flush.

Run alone: `python -m tests.bench.hop`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from typing import TYPE_CHECKING

from tests.bench import payloads
from tests.bench.common import (
    PYTHON,
    REPO,
    BusSide,
    Processes,
    Row,
    alternate,
    bench_env,
    bus_side,
    new_prefix,
    processes,
    quiet_logs,
    redis_pid,
    run_alone,
    scaled,
    wait_for_replicas,
)
from tests.bench.floor import FloorCaller

if TYPE_CHECKING:
    from hookbus.services.orchestrator.loop.plan import HookPlan

GROUP = "hop"
TS_GROUP = "hop-ts"
CONCURRENCIES = (1, 32)


def ts_worker(procs: Processes, redis_url: str, prefix: str) -> subprocess.Popen[bytes] | None:
    """A TypeScript `hookbus-worker` replica of TS_GROUP hosting the same no-op hooks
    (--concurrency 32), or None, saying why, without node or the built package."""
    node, package = shutil.which("node"), REPO / "skills" / "typescript"
    if node is None or not (package / "dist" / "worker" / "cli.js").exists():
        print("\n[hop] no TypeScript worker variant: " + ("node is not installed" if node is None else "run `make ts-deps`"))
        return None
    args = [node, str(package / "bin" / "hookbus-worker.js"), "--group", TS_GROUP,
            str(REPO / "tests" / "typescript" / "skills" / "bench_noop.ts"), "--concurrency", "32"]
    return procs.spawn(args, bench_env(redis_url, prefix), f"worker-{TS_GROUP}")


async def noop_group(
    procs: Processes, redis_url: str, prefix: str
) -> tuple[BusSide, HookPlan, subprocess.Popen[bytes], subprocess.Popen[bytes] | None]:
    """A `hookbus worker` replica hosting HopNoop (--concurrency 32), the orchestrator side
    that calls it (registry read), the plan of its hooks, the worker's process, and the
    TypeScript worker's (None when it cannot run here)."""
    from hookbus.services.orchestrator.loop.plan import HookPlan

    worker = procs.worker(redis_url, prefix, GROUP, ["tests.bench.skills:HopNoop"], concurrency=32)
    ts = ts_worker(procs, redis_url, prefix)
    side = await bus_side(redis_url, prefix)
    await wait_for_replicas(redis_url, prefix, {GROUP: 1, **({TS_GROUP: 1} if ts else {})}, procs)
    await side.runtime.registry.refresh()
    return side, HookPlan.build([], [], side.runtime.remote_hooks(), side.runtime.remote_tools()), worker, ts


async def sizes(kind: str) -> tuple[int, int]:
    """Bytes of the encoded HopEvent and HopReply of one hop of `kind`."""
    from hookbus.bus.wire.envelopes import HookRef, encode
    from hookbus.services.worker.host import GroupHost
    from tests.bench.skills import HopNoop

    data, ctx = payloads.KINDS[kind](), payloads.context()
    event = sample_event(kind, data, ctx, "r")
    host = GroupHost(GROUP, [HopNoop()])
    event.hooks = [HookRef(skill="hop-noop", method="chunk" if kind == "on_chunk" else "before")]
    reply = await host.answer(event, 1, "replica")
    return len(encode(event)[b"e"]), len(encode(reply)[b"e"])


def sample_event(kind: str, data, ctx, reply_to: str):  # type: ignore[no-untyped-def]
    from hookbus.bus.wire.envelopes import HookRef, HopEvent

    return HopEvent(
        hop_id=uuid.uuid4().hex,
        completion_id=ctx.completion_id,
        lifecycle=data.lifecycle,
        stage_key=data.lifecycle,
        hooks=[HookRef(skill="hop-noop", method="chunk" if kind == "on_chunk" else "before")],
        data=data.model_dump(mode="json"),
        ctx=ctx.model_dump(mode="json"),
        reply_to=reply_to,
        deadline=time.time() + 30,
    )


def _ops(runtime, segment, kind: str, concurrency: int, caller: FloorCaller, payload: bytes, ts_segment=None):  # type: ignore[no-untyped-def]
    """floor / hop (BusRuntime.hop + record_stage) / router (ReplyRouter.call) operations,
    and hop-ts (the same hop to the TypeScript worker) given its segment."""
    contexts = [payloads.context() for _ in range(concurrency)]
    data = payloads.KINDS[kind]()
    turn = iter(range(1 << 62))

    def hop_to(seg, group: str):  # type: ignore[no-untyped-def]
        async def hop() -> None:
            ctx = contexts[next(turn) % concurrency]
            started = time.perf_counter()
            result = await runtime.hop(seg, data, ctx, kind)
            runtime.record_stage(ctx.completion_id, kind, group, result.outcomes, (time.perf_counter() - started) * 1000)
            if result.outcomes[0].outcome != "ok":
                raise RuntimeError(result.outcomes[0].error)

        return hop

    hop = hop_to(segment, GROUP)

    event = sample_event(kind, data, contexts[0], runtime.router.reply_stream)
    stream = runtime.keys.hooks(GROUP)

    async def routed() -> None:
        await runtime.router.call(stream, event.model_copy(update={"hop_id": uuid.uuid4().hex}), 30)

    async def floor() -> None:
        await caller.call(payload)

    ops = {"floor": floor, "hop": hop, "router": routed}
    if ts_segment is not None:
        ops["hop-ts"] = hop_to(ts_segment, TS_GROUP)
    return ops


async def flush_cpu(redis_url: str, prefix: str, reply_bytes: int) -> list[Row]:
    """CPU microseconds per flush (XADD of a reply + XACK), redis-py's pipeline and
    hookbus's, taking turns (5 rounds, best round of each). This process and the Redis
    server (the bench's own, not a BENCH_REDIS_URL) share one core meanwhile: on this VM
    a wake-up across cores costs more than the flush's own code, and where the scheduler
    puts the two varies from run to run."""
    from hookbus.bus.connection.pipeline import Commands, execute
    from hookbus.bus.connection.retrying import connect

    client = connect(redis_url)
    stream, fields = f"{prefix}flush", {b"e": b"x" * reply_bytes}

    async def redis_py() -> None:
        async with client.pipeline(transaction=False) as pipe:
            pipe.xadd(stream, fields)  # type: ignore[arg-type]
            pipe.xack(stream, "g", "1-1")
            await pipe.execute(raise_on_error=False)

    async def direct() -> None:
        commands = Commands()
        commands.xadd(stream, fields)  # type: ignore[arg-type]
        commands.xack(stream, "g", "1-1")
        await execute(client, commands)

    best = {"redis-py": float("inf"), "hookbus": float("inf")}
    pinned = [0] if os.environ.get("BENCH_REDIS_URL") else [0, redis_pid(redis_url)]
    cpus = {pid: os.sched_getaffinity(pid) for pid in pinned}
    for pid in pinned:
        os.sched_setaffinity(pid, {min(cpus[pid])})
    try:
        for _ in range(5):
            for name, flush in (("redis-py", redis_py), ("hookbus", direct)):
                n = scaled(2000)
                began = time.process_time()
                for _ in range(n):
                    await flush()
                best[name] = min(best[name], (time.process_time() - began) / n * 1e6)
    finally:
        for pid, allowed in cpus.items():
            os.sched_setaffinity(pid, allowed)
        await client.delete(stream)
        await client.aclose()
    print(f"\n[hop] one flush (XADD + XACK): redis-py pipeline {best['redis-py']:.1f} us CPU, hookbus {best['hookbus']:.1f} us")
    return [Row("hop", "one flush (XADD + XACK) CPU", best["hookbus"], "us", best["redis-py"], "redis-py pipeline")]


async def measure(redis_url: str) -> list[Row]:
    quiet_logs()
    prefix = new_prefix("hop")
    size = {kind: await sizes(kind) for kind in payloads.KINDS}
    rows = await flush_cpu(redis_url, prefix, size["on_chunk"][1])
    async with processes() as procs:
        floor_stream = f"{prefix}floor"
        floor_env = bench_env(redis_url, prefix)
        procs.spawn([PYTHON, "-m", "tests.bench.floor", redis_url, floor_stream, "floor", "32", "0"], floor_env, "floor")
        side, plan, worker, ts = await noop_group(procs, redis_url, prefix)
        runtime = side.runtime
        try:
            for kind in payloads.KINDS:
                event_bytes, reply_bytes = size[kind]
                # A floor worker per payload size: restart with this kind's reply size.
                procs.children[0].terminate()
                procs.children[0].wait()
                procs.children[0] = procs.spawn(
                    [PYTHON, "-m", "tests.bench.floor", redis_url, floor_stream, "floor", "32", str(reply_bytes)],
                    floor_env, "floor",
                )
                caller = FloorCaller(redis_url, floor_stream, f"{prefix}floor-replies")
                await caller.start()
                request_payload = b"x" * event_bytes
                await caller.call(request_payload, timeout=30)  # the floor worker is up
                segments = {s.group: s for s in plan.segments(kind, ["chat"])}
                segment, ts_segment = segments[GROUP], segments.get(TS_GROUP)
                print(f"\n[hop] {kind}: HopEvent {event_bytes} B, HopReply {reply_bytes} B")
                for concurrency in CONCURRENCIES:
                    total = scaled(1500 if concurrency == 1 else 6000)
                    ops = _ops(runtime, segment, kind, concurrency, caller, request_payload, ts_segment)
                    pids = {"floor": [procs.children[0].pid], "hop": [worker.pid], "router": [worker.pid]}
                    if ts is not None:
                        pids["hop-ts"] = [ts.pid]
                    pooled, cpu = await alternate(
                        ops, concurrency=concurrency, total=total, rounds=2, warmup=scaled(100), pids=pids
                    )
                    floor, bus, router = pooled["floor"], pooled["hop"], pooled["router"]
                    for name, label in (("floor", "floor raw redis-py"), ("hop", "hookbus BusRuntime.hop"),
                                        ("router", "hookbus ReplyRouter.call"), ("hop-ts", "hookbus TypeScript worker")):
                        if name not in pooled:
                            continue
                        print(pooled[name].line(f"{label} c={concurrency}", "hops/s")
                              + f"  cpu/hop: caller {cpu[name][0]:.0f} us, worker {cpu[name][1]:.0f} us")
                    case = f"{kind} c={concurrency}"
                    if concurrency == 1:
                        rows.append(Row("hop", f"{case} p50", bus.p50_ms, "ms", floor.p50_ms, "floor", "<=1.3x"))
                        rows.append(Row("hop", f"{case} p99", bus.p99_ms, "ms", floor.p99_ms, "floor"))
                        rows.append(Row("hop", f"{case} router-only p50", router.p50_ms, "ms", floor.p50_ms, "floor"))
                    else:
                        rows.append(Row("hop", f"{case} throughput", bus.rate, "hops/s", floor.rate, "floor", ">=0.7x"))
                        rows.append(Row("hop", f"{case} p50", bus.p50_ms, "ms", floor.p50_ms, "floor"))
                        rows.append(Row("hop", f"{case} p99", bus.p99_ms, "ms", floor.p99_ms, "floor"))
                        rows.append(Row("hop", f"{case} router-only throughput", router.rate, "hops/s", floor.rate, "floor"))
                    rows.append(Row("hop", f"{case} worker CPU per hop", cpu["hop"][1], "us", cpu["floor"][1], "floor worker"))
                    rows.append(Row("hop", f"{case} caller CPU per hop", cpu["hop"][0], "us", cpu["floor"][0], "floor caller"))
                    if "hop-ts" in pooled:
                        ts_stats = pooled["hop-ts"]
                        rows.append(Row("hop", f"{case} TS worker CPU per hop", cpu["hop-ts"][1], "us", cpu["hop"][1], "Python worker"))
                        if concurrency == 1:
                            rows.append(Row("hop", f"{case} TS worker p50", ts_stats.p50_ms, "ms", bus.p50_ms, "Python worker"))
                        else:
                            rows.append(Row("hop", f"{case} TS worker throughput", ts_stats.rate, "hops/s", bus.rate, "Python worker"))
                    for name, stats in pooled.items():
                        if stats.failures:
                            rows.append(Row("hop", f"{case} {name} failures", stats.failures, "count", note=str(stats.errors)))
                await caller.stop()
        finally:
            await side.close()
    return rows


if __name__ == "__main__":
    run_alone(measure, "hop floor")
