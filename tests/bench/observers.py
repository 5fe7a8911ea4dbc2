"""Bench: what a worker group of observers adds to a request's latency (issue 30).

Two stacks run side by side on the same Redis (each: orchestrator + gateway, the cost
bench's agent and request, the offline model in this process): one has no hooks at all,
the other one worker group whose hooks are all observers, one on every lifecycle
(tests.bench.skills.WatchOnly, on_chunk included; the request compacts nothing, so its
on_compaction observer has nothing to see). Streamed requests through the gateway
with the `openai` client, one at a time, alternating between the stacks so both see the
same machine; p50 and p90 of the whole request (until the stream's end) per stack. Every
measured request of the observed stack is checked to have been observed by every hook.

Run alone: `python -m tests.bench.observers`.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from hookbus.services.worker.observer import LINGER
from tests.bench.common import Row, new_prefix, processes, quiet_logs, run_alone, scaled
from tests.bench.cost import observed_by, one_request, start_stack

REQUESTS = 60
WATCH = {"watch": ["tests.bench.skills:WatchOnly"]}


async def measure(redis_url: str) -> list[Row]:
    import openai

    from hookbus.bus.connection.retrying import connect
    from hookbus.services.testing.offline_server import OfflineModelServer
    from hookbus.skills import LIFECYCLES
    from hookbus.skills.lifecycle import Lifecycle

    quiet_logs()
    with OfflineModelServer() as model:
        async with processes() as procs:
            bare_prefix, watched_prefix = new_prefix("bare"), new_prefix("watched")
            bare_base, _ = await start_stack(procs, redis_url, bare_prefix, model.base_url, {})
            watched_base, _ = await start_stack(procs, redis_url, watched_prefix, model.base_url, WATCH)
            bare = openai.AsyncOpenAI(base_url=bare_base, api_key="bench", max_retries=0)
            watched = openai.AsyncOpenAI(base_url=watched_base, api_key="bench", max_retries=0)
            latencies: dict[str, list[float]] = {"bare": [], "watched": []}
            ids: set[str] = set()
            try:
                for _ in range(3):
                    await one_request(bare)
                    await one_request(watched)
                for _ in range(scaled(REQUESTS)):
                    for name, client in (("bare", bare), ("watched", watched)):
                        began = time.perf_counter()
                        completion_id = await one_request(client)
                        latencies[name].append(time.perf_counter() - began)
                        if name == "watched":
                            ids.add(completion_id)
                await asyncio.sleep(LINGER + 0.5)  # the last observations (a replica reads once per LINGER)
                redis = connect(redis_url)
                try:
                    observed = await observed_by(redis, watched_prefix, ids)
                finally:
                    await redis.aclose()
            finally:
                await bare.close()
                await watched.close()
    # the request compacts nothing: every lifecycle point but on_compaction
    expected = {f"watch-only.w_{lc}" for lc in LIFECYCLES if lc != Lifecycle.ON_COMPACTION}
    short = sorted(cid for cid, hooks in observed.items() if not expected <= hooks)
    if short:
        raise RuntimeError(f"{len(short)} requests not seen by every observer, e.g. {short[0]}")
    p50 = {name: statistics.median(values) * 1000 for name, values in latencies.items()}
    p90 = {name: statistics.quantiles(values, n=10)[-1] * 1000 for name, values in latencies.items()}
    print(f"\n[observers] streamed request, c=1, {len(latencies['bare'])} each, alternating: "
          f"no hooks p50 {p50['bare']:.1f} ms p90 {p90['bare']:.1f} ms; "
          f"a group of {len(expected)} observers p50 {p50['watched']:.1f} ms p90 {p90['watched']:.1f} ms")
    return [
        Row("observers", "p50, c=1: only remote hooks are observers", p50["watched"], "ms", p50["bare"],
            "no hooks", target="<=1.3x"),
        Row("observers", "p90, c=1: only remote hooks are observers", p90["watched"], "ms", p90["bare"], "no hooks"),
    ]


if __name__ == "__main__":
    run_alone(measure, "observers")
