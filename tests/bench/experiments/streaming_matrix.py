"""What pipelining on_chunk gains: the streaming bench (tests.bench.streaming) with

  today      Agent (one hop per chunk, each awaited) + `hookbus worker`
  pipelined  experiments/pipelined_chunks.PipelinedAgent (64 chunks in flight) + `hookbus worker`
  pipe+lean  PipelinedAgent + experiments/lean_worker (XREADGROUP loop, batched replies)
  +split     the same with the split wire format on both sides (fast_runtime.patch_runtime)

each against its own no-hook run on the same stack. Written before the fixes went in:
"today" is now the real Agent (pipelined remote on_chunk) + the real worker (read loop,
batched replies, split format).

    python -m tests.bench.experiments.streaming_matrix
"""

from __future__ import annotations

import asyncio

from tests.bench.common import Row, bench_redis, print_rows, quiet_logs
from tests.bench.streaming import Timings, rows_of, run_streaming

PIPELINED = "tests.bench.experiments.pipelined_chunks:agent"
LEAN = ["tests.bench.experiments.lean_worker", "--group", "chunk", "tests.bench.skills:ChunkNoop", "--concurrency", "32"]


async def measure(redis_url: str) -> list[Row]:
    quiet_logs()
    rows: list[Row] = []
    for label, agent, worker in (
        ("today", "tests.bench.skills:stream_agent", None),
        ("pipelined", PIPELINED, None),
        ("pipelined+lean worker", PIPELINED, LEAN),
        ("pipelined (yield each)+lean", "tests.bench.experiments.pipelined_chunks:agent_yield_each", LEAN),
        ("pipelined+lean+split format", "tests.bench.experiments.pipelined_chunks:fast_agent", LEAN),
    ):
        hooked, plain = await run_streaming(redis_url, agent=agent, worker=worker, requests=5)
        print(f"  {label:<24} no hook total {Timings.median(plain.total):7.1f} ms   "
              f"with hook total {Timings.median(hooked.total):7.1f} ms  first {Timings.median(hooked.first):6.2f} ms")
        rows += [r for r in rows_of(label, hooked, plain) if "delay" not in r.case]
    for row in rows:
        row.bench = "fixes"
    return rows


async def main() -> list[Row]:
    with bench_redis() as url:
        rows = await measure(url)
    print_rows("on_chunk pipelining (experiments)", rows)
    return rows


if __name__ == "__main__":
    asyncio.run(main())
