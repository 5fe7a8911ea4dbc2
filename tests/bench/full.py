"""Bench 3, a full request: non-streaming, through every non-chunk lifecycle stage, on the
bus against the same agent in-process.

The request ("Look it up. [[tool:lookup ...]]") makes the built-in offline model call an
in-process tool once and then answer: on_connection, before_llm_call, LLM, after_llm_call,
before_toolcall, tool, after_toolcall, before_llm_call, LLM, after_llm_call, on_message,
finalize_connection. Every stage has 3 remote no-op hooks in 2 worker groups: `alpha`
(2 hooks, priorities 10 and 20: one hop) and `beta` (1 hook, priority 30: one hop), so
18 hops per request.

- bus: HookbusClient.complete() -> `hookbus orchestrator` -> `hookbus worker` x2
  (--concurrency 64); every piece a separate process;
- in-process: Agent.run() of the same agent with the same hooks as local skills, in this
  process.
Both call the same offline model, in a process of its own (as an LLM provider runs
apart: in a thread of the caller it would take the GIL from the caller's loop).
The bus overhead per request is p50(bus) - p50(in-process), and the ratio of the two.
At c=1 a second stack runs with HOOKBUS_SEND_ON=false (every hop from the orchestrator),
taking turns with the first in rounds: the same-run baseline of what sending each stage
on from alpha's worker to beta's saves (hookbus.bus.hops.send_on).
- the floor: the transport this request needs, done by raw redis-py processes with no
  hookbus code (tests.bench.floor), c=1: the request's own round trip (client ->
  orchestrator -> client) and each of the 9 stages sent on from alpha's worker to beta's,
  in sequence as on the bus. No implementation of these semantics over Redis Streams on
  this machine can add less to the in-process run, so in-process + floor against
  in-process says whether the "<= 2x in-process at c=1" target is reachable at all.

Run alone: `python -m tests.bench.full`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from tests.bench.common import (
    PYTHON,
    Processes,
    Row,
    Stats,
    bench_env,
    bench_redis,
    new_prefix,
    print_rows,
    processes,
    quiet_logs,
    run_load,
    scaled,
    wait_for_replicas,
)
from tests.bench.floor import FloorCaller
from tests.bench.skills import FULL_PROMPT, full_agent_inprocess
from tests.faults.helpers import version_stream

CONCURRENCIES = (1, 16, 64)
ROUNDS = 4
"""Rounds of c=1 requests, each stack in turn."""
STAGES = 9
HOPS_PER_REQUEST = 2 * STAGES
"""One hop per group (alpha, beta) and stage."""
FLOOR_BYTES = 2048
"""What each floor hop carries: about what one no-op stage hop of this request does."""
EXPECTED = "The tool lookup returned: value of k"


def counts(concurrency: int) -> int:
    return scaled({1: 60, 16: 300, 64: 500}[concurrency])


async def wait_for_orchestrator(client, keys, procs, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not await client.redis.zcard(keys.orchestrators):
            procs.check_alive()
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def bus_stack(
    redis_url: str, prefix: str, procs: Processes, model_url: str, *, send_on: bool = True
) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """The two worker groups and an orchestrator under `prefix`; yields one request's
    call. `send_on=False`: the orchestrator sends every hop itself (HOOKBUS_SEND_ON)."""
    from hookbus.bus.client import HookbusClient
    from hookbus.bus.keys import Keys

    procs.worker(redis_url, prefix, "alpha", ["tests.bench.skills:Alpha"], concurrency=64)
    procs.worker(redis_url, prefix, "beta", ["tests.bench.skills:Beta"], concurrency=64)
    await wait_for_replicas(redis_url, prefix, {"alpha": 1, "beta": 1}, procs)
    procs.orchestrator(
        redis_url, prefix, "tests.bench.skills:full_agent", concurrency=64, model_url=model_url,
        HOOKBUS_SEND_ON=str(send_on).lower(),
    )
    keys = Keys(prefix)
    client = HookbusClient(redis_url, prefix=prefix, timeout=120)
    try:
        await wait_for_orchestrator(client, keys, procs)
        completion = await client.complete(FULL_PROMPT)
        assert completion.choices[0].message.content == EXPECTED, completion
        hops_before = sum(
            [await client.redis.xlen(await version_stream(client.redis, keys, group)) for group in ("alpha", "beta")]
        )
        assert hops_before == HOPS_PER_REQUEST, f"expected {HOPS_PER_REQUEST} hops per request, saw {hops_before}"

        async def request() -> None:
            answer = await client.complete(FULL_PROMPT)
            if answer.choices[0].message.content != EXPECTED:
                raise RuntimeError(f"unexpected answer {answer.choices[0].message.content!r}")

        yield request
    finally:
        await client.close()


async def on_bus(redis_url: str, procs: Processes, model_url: str) -> tuple[dict[int, Stats], Stats]:
    """The bus at each concurrency, and at c=1 with every hop from the orchestrator too
    (the baseline of what sending a stage on from alpha's worker to beta's saves),
    the two taking turns in rounds on two stacks, so the machine's drift hits both."""
    results: dict[int, Stats] = {}
    async with (
        bus_stack(redis_url, new_prefix("full"), procs, model_url) as routed,
        bus_stack(redis_url, new_prefix("full-hops"), procs, model_url, send_on=False) as hop_by_hop,
    ):
        rounds: tuple[list[Stats], list[Stats]] = ([], [])
        for _ in range(ROUNDS):
            for request, stats in ((routed, rounds[0]), (hop_by_hop, rounds[1])):
                stats.append(await run_load(request, concurrency=1, total=counts(1) // ROUNDS, warmup=2, max_seconds=60))
        results[1] = Stats.merged(rounds[0])
        for concurrency in CONCURRENCIES[1:]:
            results[concurrency] = await run_load(
                routed, concurrency=concurrency, total=counts(concurrency), warmup=scaled(min(concurrency * 2, 40)),
                max_seconds=60,
            )
    return results, Stats.merged(rounds[1])


async def in_process(model_url: str) -> dict[int, Stats]:
    from hookbus.services.orchestrator.llm.client import LLM

    # the HTTP stack the orchestrator service runs on, so the baseline compares like with like
    agent = full_agent_inprocess(LLM(model_url, "bench", http="aiohttp"))

    async def request() -> None:
        answer = await agent.run(FULL_PROMPT)
        if answer.choices[0].message.content != EXPECTED:
            raise RuntimeError(f"unexpected answer {answer.choices[0].message.content!r}")

    results = {}
    try:
        await request()
        for concurrency in CONCURRENCIES:
            results[concurrency] = await run_load(
                request, concurrency=concurrency, total=counts(concurrency), warmup=scaled(min(concurrency * 2, 40)),
                max_seconds=60,
            )
    finally:
        await agent.aclose()
    return results


async def at_the_floor(redis_url: str, procs: Processes) -> Stats:
    """This request's transport at the floor, c=1 (see the module's docstring): three
    raw redis-py workers stand for the orchestrator and the two groups."""
    prefix = new_prefix("full-floor")
    streams = {name: f"{prefix}{name}" for name in ("orchestrator", "alpha", "beta")}
    for name, stream in streams.items():
        procs.spawn(
            [PYTHON, "-m", "tests.bench.floor", redis_url, stream, name, "32", str(FLOOR_BYTES)],
            bench_env(redis_url, prefix), f"floor-{name}",
        )
    client = FloorCaller(redis_url, streams["orchestrator"], f"{prefix}client-replies")
    orchestrator = FloorCaller(redis_url, streams["alpha"], f"{prefix}orchestrator-replies")
    payload = b"x" * FLOOR_BYTES
    await client.start()
    await orchestrator.start()

    async def request() -> None:
        await client.call(payload)
        for _ in range(STAGES):
            await orchestrator.call(payload, via=streams["beta"])

    try:
        await asyncio.wait_for(request(), 30)  # every floor worker is up
        return await run_load(request, concurrency=1, total=counts(1), warmup=2, max_seconds=60)
    finally:
        await client.stop()
        await orchestrator.stop()


async def measure(redis_url: str) -> list[Row]:
    quiet_logs()
    async with processes() as procs:
        model_url = await procs.model()
        local = await in_process(model_url)
        bus, hop_by_hop = await on_bus(redis_url, procs, model_url)
        floor = await at_the_floor(redis_url, procs)
    rows: list[Row] = []
    print(f"\n[full] non-streaming request, {STAGES} stages x 3 remote no-op hooks in 2 groups ({HOPS_PER_REQUEST} hops), 2 LLM calls")
    for concurrency in CONCURRENCIES:
        print(local[concurrency].line(f"in-process Agent.run c={concurrency}", "req/s"))
        print(bus[concurrency].line(f"bus (client -> orchestrator -> workers) c={concurrency}", "req/s"))
    print(hop_by_hop.line("bus, every hop from the orchestrator (HOOKBUS_SEND_ON=false) c=1", "req/s"))
    print(floor.line(f"the transport at the floor (raw redis-py, 1 + {STAGES} relayed round trips) c=1", "req/s"))
    for concurrency in CONCURRENCIES:
        b, here = bus[concurrency], local[concurrency]
        rows.append(Row("full", f"c={concurrency} throughput", b.rate, "req/s", here.rate, "in-process"))
        rows.append(Row("full", f"c={concurrency} p50", b.p50_ms, "ms", here.p50_ms, "in-process",
                        "<=2x" if concurrency == 1 else ""))
        rows.append(Row("full", f"c={concurrency} p99", b.p99_ms, "ms", here.p99_ms, "in-process"))
        overhead = b.p50_ms - here.p50_ms
        rows.append(
            Row("full", f"c={concurrency} bus overhead/request (p50)", overhead, "ms",
                note=f"{overhead / HOPS_PER_REQUEST:.2f} ms per hop" if concurrency == 1 else "queueing included")
        )
        if concurrency == 1:
            rows.append(Row("full", "c=1 p50, stages sent on from group to group", b.p50_ms, "ms",
                            hop_by_hop.p50_ms, "hop by hop"))
            rows.append(Row("full", "c=1 transport at the floor p50", floor.p50_ms, "ms",
                            note=f"raw redis-py: the request's round trip + {STAGES} stages sent on"))
            rows.append(Row("full", "c=1 p50 at the floor (in-process + floor transport)",
                            here.p50_ms + floor.p50_ms, "ms", here.p50_ms, "in-process", "<=2x",
                            note="what no implementation of these semantics beats here"))
            rows.append(Row("full", "c=1 bus overhead over the floor transport", overhead, "ms",
                            floor.p50_ms, "floor transport"))
        if b.failures or here.failures:
            rows.append(Row("full", f"c={concurrency} failures", b.failures, "count", here.failures, "in-process"))
    return rows


async def main() -> list[Row]:
    with bench_redis() as url:
        started = time.perf_counter()
        rows = await measure(url)
    print_rows(f"full request ({time.perf_counter() - started:.0f}s)", rows)
    return rows


if __name__ == "__main__":
    asyncio.run(main())
