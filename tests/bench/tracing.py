"""Bench: what tracing costs a hop, off and on, in one run.

The hop bench's operation (tests/bench/hop.py: `BusRuntime.hop` + `record_stage` on a
realistic `on_chunk` or `before_llm_call` HopEvent, a real `hookbus worker` hosting a
no-op hook), wrapped in the stage span `stage_runner.run_stage` opens, three ways, taking turns:

- off: tracing off in this (orchestrator) process, worker group `hop` without OTEL_*;
- off, worker on: tracing off here, worker group `hoptraced` set up to export (its hops
  carry no trace context, so it starts no span): the difference between two equivalent
  off variants is the noise of the run;
- on: tracing on here and in `hoptraced`, batch span processor with its defaults, OTLP/HTTP
  protobuf to a receiver in a process of its own: stage, hop, process and hook spans per
  hop (4 spans, 2 processes).

Plus the off path alone: the tracing calls one hop makes while off, timed in a loop.
Run alone: `python -m tests.bench.tracing`.
"""

from __future__ import annotations

import asyncio
import os
import time

from hookbus.bus.connection.embedded import free_port
from tests.bench import payloads
from tests.bench.common import (
    PYTHON,
    Row,
    alternate,
    bench_env,
    bus_side,
    new_prefix,
    processes,
    quiet_logs,
    run_alone,
    scaled,
    timeit_us,
    wait_for_replicas,
)

GROUPS = {"off": "hop", "off, worker on": "hoptraced", "on": "hoptraced"}
CONCURRENCIES = (1, 32)


async def receiver_ready(port: int, procs) -> None:  # type: ignore[no-untyped-def]
    """Until the receiver process accepts connections."""
    for _ in range(600):
        procs.check_alive()
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return
    raise TimeoutError(f"the OTLP receiver did not listen on {port}")


def off_path_us() -> float:
    """The tracing calls of one hop while off: stage span, hop span (carrier, reply),
    the worker's process span and hook observer."""
    from hookbus.services.observability import tracing

    def one_hop() -> None:
        with tracing.stage_span("on_chunk", "on_chunk#1"), tracing.hop_span("g", "s", "on_chunk", ()) as hop:
            _ = hop.carrier
            hop.replied("r", None, ())
        with tracing.process_span("g", "r", "on_chunk", None, 1):
            tracing.hook_observer()

    return timeit_us(one_hop)


def _ops(runtime, tracer, by_group, kind: str, concurrency: int):  # type: ignore[no-untyped-def]
    """One operation per variant: what the loop's stage runner does for one remote segment."""
    from hookbus.services.observability import tracing

    contexts = [payloads.context() for _ in range(concurrency)]
    data = payloads.KINDS[kind]()
    turn = iter(range(1 << 62))

    def op(variant: str):  # type: ignore[no-untyped-def]
        segment = by_group[GROUPS[variant]]
        on = tracer if variant == "on" else None

        async def hop() -> None:
            tracing._tracer = on
            ctx = contexts[next(turn) % concurrency]
            started = time.perf_counter()
            with tracing.stage_span(kind, kind):
                result = await runtime.hop(segment, data, ctx, kind)
            runtime.record_stage(ctx.completion_id, kind, segment.group, result.outcomes, (time.perf_counter() - started) * 1000)
            if result.outcomes[0].outcome != "ok":
                raise RuntimeError(result.outcomes[0].error)

        return hop

    return {variant: op(variant) for variant in GROUPS}


async def measure(redis_url: str) -> list[Row]:
    from hookbus.services.observability import tracing
    from hookbus.services.orchestrator.loop.plan import HookPlan

    quiet_logs()
    rows = [Row("tracing", "off: tracing calls of one hop", off_path_us(), "us", note="timed in a loop")]
    prefix = new_prefix("trace")
    port = free_port()
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"}
    async with processes() as procs:
        receiver = procs.spawn([PYTHON, "-m", "tests.otlp_receiver", str(port)], bench_env(redis_url, prefix), "otlp")
        await receiver_ready(port, procs)
        skills = ["tests.bench.skills:HopNoop"]
        plain = procs.worker(redis_url, prefix, "hop", skills, concurrency=32)
        traced_args = [PYTHON, "-m", "hookbus.services.cli.main", "worker", "--group", "hoptraced", *skills, "--concurrency", "32"]
        traced = procs.spawn(traced_args, bench_env(redis_url, prefix, **otel), "worker-hoptraced")
        side = await bus_side(redis_url, prefix)
        await wait_for_replicas(redis_url, prefix, {"hop": 1, "hoptraced": 1}, procs)
        os.environ.update(otel)
        assert tracing.configure_tracing("orchestrator", "bench-orchestrator")
        tracer = tracing._tracer  # switched per operation below: one process, both variants
        tracing._tracer = None
        runtime = side.runtime
        await runtime.registry.refresh()
        plan = HookPlan.build([], [], runtime.remote_hooks(), runtime.remote_tools())
        try:
            for kind in payloads.KINDS:
                by_group = {s.group: s for s in plan.segments(kind, ["chat"])}
                print(f"\n[tracing] {kind}")
                for concurrency in CONCURRENCIES:
                    ops = _ops(runtime, tracer, by_group, kind, concurrency)
                    pids = {"off": [plain.pid], "off, worker on": [traced.pid], "on": [traced.pid]}
                    total = scaled(1500 if concurrency == 1 else 6000)
                    pooled, cpu = await alternate(ops, concurrency=concurrency, total=total, rounds=3, warmup=scaled(100), pids=pids)
                    tracing._tracer = None
                    off = pooled["off"]
                    for variant, stats in pooled.items():
                        print(stats.line(f"{variant} c={concurrency}", "hops/s")
                              + f"  cpu/hop: caller {cpu[variant][0]:.0f} us, worker {cpu[variant][1]:.0f} us")
                    case = f"{kind} c={concurrency}"
                    for variant in ("off, worker on", "on"):
                        stats = pooled[variant]
                        if concurrency == 1:
                            rows.append(Row("tracing", f"{case} {variant} p50", stats.p50_ms, "ms", off.p50_ms, "off"))
                        else:
                            rows.append(Row("tracing", f"{case} {variant} throughput", stats.rate, "hops/s", off.rate, "off"))
                        rows.append(Row("tracing", f"{case} {variant} caller CPU per hop", cpu[variant][0], "us", cpu["off"][0], "off"))
                        rows.append(Row("tracing", f"{case} {variant} worker CPU per hop", cpu[variant][1], "us", cpu["off"][1], "off"))
                    for variant, stats in pooled.items():
                        if stats.failures:
                            rows.append(Row("tracing", f"{case} {variant} failures", stats.failures, "count", note=str(stats.errors)))
        finally:
            tracing._tracer = tracer
            tracing.shutdown_tracing()
            await side.close()
            procs.stop(traced)
            procs.stop(receiver)
            received = procs.logs[procs.children.index(receiver)].read_text()
            print(f"[tracing] receiver: {received.strip().splitlines()[-1]}")
    return rows


if __name__ == "__main__":
    run_alone(measure, "tracing")
