"""Bench: long streamed answers through a worker group's on_chunk hook against the same
answers with no hook, on one stack, rounds alternated (issue 45: "linear streams").

One stack: `hookbus orchestrator` (tests.bench.skills:stream_agent), one `hookbus worker`
of group `chunk` hosting tests.bench.skills:ChunkReader (its hook reads `full_content`,
scope "chunky": a caller with the scope gets it on every chunk, one without gets no hook),
and a stub model (tests.bench.long_model) streaming the answer in 4 KiB chunks. Each
round runs, with and without the hook: eight concurrent 2 MiB answers, then one 8 MiB
answer, each case on an orchestrator started for it. Per case: the orchestrator's memory
growth (its resident set sampled every 10 ms during the case, the most above where it
began after one short answer of the same kind), Redis's bytes received per byte of
answer (`INFO stats` total_net_input_bytes: the requests, the hops, the replies and the
response streams), and the time to the last byte (the slowest of the eight; the one).

Run alone: `python -m tests.bench.long_streams`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio as aredis

from hookbus.bus.client import HookbusClient
from hookbus.bus.connection.embedded import free_port
from hookbus.bus.keys import Keys
from tests.bench.common import (
    PYTHON,
    Processes,
    Row,
    new_prefix,
    processes,
    quick,
    quiet_logs,
    run_alone,
    wait_for_http,
    wait_for_replicas,
)
from tests.bench.full import wait_for_orchestrator
from tests.bench.long_model import prompt

CHUNK = 4096
MIB = 1024 * 1024


@dataclass(frozen=True)
class Shape:
    label: str
    streams: int
    size: int


def shapes() -> list[Shape]:
    if quick():
        return [Shape("8 x 256 KiB", 8, MIB // 4), Shape("1 x 1 MiB", 1, MIB)]
    return [Shape("8 x 2 MiB", 8, 2 * MIB), Shape("1 x 8 MiB", 1, 8 * MIB)]


@dataclass
class Figures:
    """One shape, with or without the hook, over the rounds."""

    memory_mb: list[float] = field(default_factory=list)
    redis_per_byte: list[float] = field(default_factory=list)
    last_byte_s: list[float] = field(default_factory=list)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


@contextlib.asynccontextmanager
async def _peak_growth(pid: int) -> AsyncIterator[list[float]]:
    """Yields a list that holds, once the block ends, the most the resident set of `pid`
    grew above where it began (MB), sampled every 10 ms."""
    began = _rss_mb(pid)
    peak = [began]

    async def sample() -> None:
        while True:
            peak[0] = max(peak[0], _rss_mb(pid))
            await asyncio.sleep(0.01)

    sampler = asyncio.ensure_future(sample())
    grown: list[float] = []
    try:
        yield grown
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        grown.append(max(peak[0], _rss_mb(pid)) - began)


async def _net_in(redis: aredis.Redis) -> int:
    return int((await redis.info("stats"))["total_net_input_bytes"])


async def _one(client: HookbusClient, size: int, hooked: bool) -> float:
    """One streamed answer; the seconds to its last byte."""
    began = time.perf_counter()
    got = 0
    async for chunk in client.stream(prompt(size, CHUNK), auth={"scopes": ["chunky"] if hooked else []}):
        for choice in chunk.choices:
            got += len(choice.delta.content or "")
    if got != size:
        raise RuntimeError(f"expected {size} characters, got {got}")
    return time.perf_counter() - began


async def _case(client: HookbusClient, pid: int, shape: Shape, hooked: bool, into: Figures) -> None:
    redis = client.redis
    received = await _net_in(redis)
    async with _peak_growth(pid) as grown:
        times = await asyncio.gather(*(_one(client, shape.size, hooked) for _ in range(shape.streams)))
    into.memory_mb.append(grown[0])
    into.redis_per_byte.append((await _net_in(redis) - received) / (shape.streams * shape.size))
    into.last_byte_s.append(max(times))


async def _long_model(procs: Processes) -> str:
    port = free_port()
    procs.spawn([PYTHON, "-m", "tests.bench.long_model", str(port)], dict(os.environ), "long-model")
    base = f"http://127.0.0.1:{port}/v1"
    await wait_for_http(f"{base}/models", procs)
    return base


async def run(redis_url: str, rounds: int) -> dict[tuple[str, bool], Figures]:
    """Each case on an orchestrator of its own, started for it and warmed with one short
    answer of the same kind: its memory growth is the case's, not what an earlier case
    left in its heap."""
    prefix = new_prefix("long")
    figures = {(s.label, hooked): Figures() for s in shapes() for hooked in (True, False)}
    async with processes() as procs:
        procs.worker(redis_url, prefix, "chunk", ["tests.bench.skills:ChunkReader"], concurrency=32)
        await wait_for_replicas(redis_url, prefix, {"chunk": 1}, procs)
        model_url = await _long_model(procs)
        client = HookbusClient(redis_url, prefix=prefix, timeout=300)
        try:
            for n in range(rounds):
                order = (False, True) if n % 2 == 0 else (True, False)
                for shape in shapes():
                    for hooked in order:
                        orchestrator = procs.orchestrator(redis_url, prefix, "tests.bench.skills:stream_agent", model_url=model_url)
                        await wait_for_orchestrator(client, Keys(prefix), procs)
                        await _one(client, MIB // 4, hooked)
                        await _case(client, orchestrator.pid, shape, hooked, figures[(shape.label, hooked)])
                        procs.check_alive()
                        procs.retire(orchestrator)
        finally:
            await client.close()
    return figures


def rows_of(figures: dict[tuple[str, bool], Figures]) -> list[Row]:
    rows: list[Row] = []
    for shape in shapes():
        hooked, plain = figures[(shape.label, True)], figures[(shape.label, False)]
        most = 100 if shape.streams > 1 else 60
        rows += [
            Row("long streams", f"{shape.label}: orchestrator memory growth, remote on_chunk", max(hooked.memory_mb), "MB",
                max(plain.memory_mb), "no hook", f"<={most}", note=f"target: within +{most} MB (worst round)"),
            Row("long streams", f"{shape.label}: Redis bytes received per answer byte, remote on_chunk",
                statistics.median(hooked.redis_per_byte), "B/B", statistics.median(plain.redis_per_byte), "no hook", "<=2.5"),
            Row("long streams", f"{shape.label}: time to the last byte, remote on_chunk", statistics.median(hooked.last_byte_s) * 1000,
                "ms", statistics.median(plain.last_byte_s) * 1000, "no hook", "<=1.5x"),
        ]
    return rows


async def measure(redis_url: str) -> list[Row]:
    quiet_logs()
    rounds = 1 if quick() else 3
    print(f"\n[long streams] answers in {CHUNK}-character chunks, remote on_chunk hook (reads full_content) vs none, {rounds} round(s), alternated")
    figures = await run(redis_url, rounds)
    for (label, hooked), f in figures.items():
        print(f"  {label:<12} {'remote on_chunk' if hooked else 'no hook':<16} memory +{', '.join(f'{m:.0f}' for m in f.memory_mb)} MB"
              f"   Redis in {', '.join(f'{r:.2f}' for r in f.redis_per_byte)} B/B"
              f"   last byte {', '.join(f'{t * 1000:.0f}' for t in f.last_byte_s)} ms")
    return rows_of(figures)


if __name__ == "__main__":
    run_alone(measure, "long streams")
