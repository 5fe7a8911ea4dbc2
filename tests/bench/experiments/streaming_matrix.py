"""What pipelining on_chunk gains: the streaming bench (tests.bench.streaming) with the real
Agent and `hookbus worker`, one hop per chunk (`chunk_window=1`, the default) against 64
chunks in flight (`chunk_window=64`), each against its own no-hook run on the same stack.

    python -m tests.bench.experiments.streaming_matrix
"""

from __future__ import annotations

import asyncio

from tests.bench.common import Row, bench_redis, print_rows, quiet_logs
from tests.bench.streaming import Timings, rows_of, run_streaming


async def measure(redis_url: str) -> list[Row]:
    quiet_logs()
    rows: list[Row] = []
    for label, agent in (
        ("one chunk at a time", "tests.bench.skills:sequential_stream_agent"),
        ("pipelined (64)", "tests.bench.skills:stream_agent"),
    ):
        hooked, plain = await run_streaming(redis_url, agent=agent, worker=None, requests=5)
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
