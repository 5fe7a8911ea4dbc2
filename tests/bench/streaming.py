"""Bench 4, streaming: a 500-chunk answer (`[[words:500]]` from the built-in offline model)
with one remote no-op `on_chunk` hook against the same answer with no hook.

One stack: `hookbus orchestrator` (tests.bench.skills:stream_agent), one `hookbus worker`
of group `chunk` hosting tests.bench.skills:ChunkNoop, whose hook has scope "chunky", and
the offline model in a process of its own (as an LLM provider runs apart: in a thread of
the orchestrator it took the GIL from the orchestrator's loop while it streamed); a
request whose caller holds that scope gets the hook on every chunk, one without gets no
hook at all, so both cases share every process. Requests go through HookbusClient.stream()
one at a time, alternating with and without the hook. Time to first chunk is from the
call to the first chunk with text the client gets (a role-only chunk shows nothing, and
the response writer sends it with the first text); total is to the end of the stream.

Run alone: `python -m tests.bench.streaming`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from tests.bench.common import (
    PYTHON,
    Row,
    bench_env,
    new_prefix,
    processes,
    quiet_logs,
    run_alone,
    scaled,
    wait_for_replicas,
)
from tests.bench.cost import hops_of
from tests.bench.skills import STREAM_PROMPT

CHUNKS = 500
EVENTS_FLUSHED = 0.5
"""Seconds for the worker's monitor records to reach `events` (it flushes every 100 ms)."""


@dataclass
class Timings:
    first: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    hops: float = 0.0
    """on_chunk hops per request (mean, from the worker's monitor records)."""

    @staticmethod
    def median(values: list[float]) -> float:
        ordered = sorted(values)
        return ordered[len(ordered) // 2] * 1000 if ordered else float("nan")


async def run_streaming(
    redis_url: str,
    *,
    agent: str = "tests.bench.skills:stream_agent",
    worker: Sequence[str] | None = None,
    requests: int = 8,
) -> tuple[Timings, Timings]:
    """(with hook, without hook) timings through a fresh stack; `worker` replaces the
    `hookbus worker` command (arguments after `python -m`)."""
    from hookbus.bus.client import HookbusClient
    from hookbus.bus.keys import Keys
    from tests.bench.full import wait_for_orchestrator

    prefix = new_prefix("stream")
    hooked, plain = Timings(), Timings()
    async with processes() as procs:
        if worker is None:
            procs.worker(redis_url, prefix, "chunk", ["tests.bench.skills:ChunkNoop"], concurrency=32)
        else:
            procs.spawn([PYTHON, "-m", *worker], bench_env(redis_url, prefix), "chunk-worker")
        await wait_for_replicas(redis_url, prefix, {"chunk": 1}, procs)
        procs.orchestrator(redis_url, prefix, agent, model_url=await procs.model())
        client = HookbusClient(redis_url, prefix=prefix, timeout=120)
        try:
            await wait_for_orchestrator(client, Keys(prefix), procs)

            hooked_ids: set[str] = set()

            async def one(scopes: list[str], into: Timings | None) -> None:
                began = time.perf_counter()
                first = None
                words = 0
                async for chunk in client.stream(STREAM_PROMPT, auth={"scopes": scopes}):
                    if into is hooked:
                        hooked_ids.add(chunk.id)
                    if chunk.choices and chunk.choices[0].delta.content:
                        first = first or time.perf_counter() - began
                        words += len(chunk.choices[0].delta.content.split())
                total = time.perf_counter() - began
                if words != CHUNKS:
                    raise RuntimeError(f"expected {CHUNKS} words, got {words}")
                if into is not None:
                    into.first.append(first or total)
                    into.total.append(total)

            await one(["chunky"], None)  # warm both paths
            await one([], None)
            for _ in range(scaled(requests)):
                await one(["chunky"], hooked)
                await one([], plain)
            await asyncio.sleep(EVENTS_FLUSHED)
            hooked.hops = (await hops_of(client.redis, prefix, hooked_ids))["on_chunk"] / len(hooked_ids)
        finally:
            await client.close()
    return hooked, plain


def rows_of(label: str, hooked: Timings, plain: Timings) -> list[Row]:
    total_h, total_p = Timings.median(hooked.total), Timings.median(plain.total)
    first_h, first_p = Timings.median(hooked.first), Timings.median(plain.first)
    return [
        Row("streaming", f"{label} total, 500 chunks", total_h, "ms", total_p, "no hook", "<=1.3x",
            note=f"{(total_h - total_p) / CHUNKS * 1000:.0f} us extra per chunk"),
        Row("streaming", f"{label} time to first chunk", first_h, "ms", first_p, "no hook",
            note=f"+{first_h - first_p:.2f} ms (target +1.5 ms)"),
        Row("streaming", f"{label} first-chunk delay", first_h - first_p, "ms", target="<=1.5"),
        Row("streaming", f"{label} on_chunk hops per request", hooked.hops, "", note=f"{CHUNKS / hooked.hops:.1f} chunks a hop"),
    ]


async def measure(redis_url: str) -> list[Row]:
    """The default (on_chunk hops batched) and one hop per chunk (`chunk_batch=1`), each
    against its own no-hook run on the same stack."""
    quiet_logs()
    rows: list[Row] = []
    print(f"\n[streaming] {CHUNKS}-chunk answer through HookbusClient.stream(), medians of {scaled(8)}")
    for label, agent in (
        ("batched (default)", "tests.bench.skills:stream_agent"),
        ("one chunk per hop", "tests.bench.skills:sequential_stream_agent"),
    ):
        hooked, plain = await run_streaming(redis_url, agent=agent)
        print(f"  {label:<18} no hook: first {Timings.median(plain.first):8.2f} ms  total {Timings.median(plain.total):8.1f} ms"
              f"   remote on_chunk: first {Timings.median(hooked.first):8.2f} ms  total {Timings.median(hooked.total):8.1f} ms")
        rows += rows_of(label, hooked, plain)
    return rows


if __name__ == "__main__":
    run_alone(measure, "streaming")
