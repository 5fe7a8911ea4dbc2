"""Bench: what one streamed request costs, summed over every process (issue 14).

The demo-like request: an openai client streams "Look it up. [[tool:lookup ...]]" through
a real `hookbus gateway`; the offline model (an HTTP server in the bench's own process,
as the LLM provider is elsewhere: not counted) calls the orchestrator's in-process tool
`lookup` once, then answers in 20 text chunks. Two worker groups: `policy` has a no-op
hook on every lifecycle (on_chunk included), `audit` one on on_connection,
before_toolcall and finalize_connection (tests.bench.skills: CostPolicy, CostAudit).

Figures per request, from a run of sequential requests (c=1):
- Redis commands (INFO commandstats deltas, commands a script runs included), by command,
  with the time Redis spent in each (commandstats `usec`; a script's time includes the
  commands it runs, which also count on their own; the rest of Redis's CPU is its work
  per socket read and write);
- Redis CPU (INFO cpu, user + system of the server);
- socket writes to Redis (INFO stats `total_reads_processed`: the read events the server
  handled, one per client write that reached it separately): what pipelining saves, as
  a command count does not show it;
- Python CPU of each service process (/proc), and their sum;
- hops (the worker groups' monitor records) and wall time;
and streamed requests/s at c=8, with the Redis commands and Python CPU per request of
those rounds (time-driven work, event flushes, acks, observer reads, is shared by more
requests than at c=1). What the services do with no request (heartbeats,
registry, claims, janitor) is measured in an idle window of the same stack and subtracted
at its rate, so the figures are the request's own; the idle rates are printed too.

The same mix with its watching hooks declared observers, and another mix, are measured
beside this one by the observers bench (tests.bench.observers), with `run_costs`.

Run alone: `python -m tests.bench.cost`.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hookbus.services.worker.observer import LINGER
from tests.bench.common import (
    PYTHON,
    Processes,
    Row,
    bench_env,
    cpu_seconds,
    free_port,
    new_prefix,
    processes,
    quiet_logs,
    run_alone,
    scaled,
    wait_for_http,
    wait_for_replicas,
)
from tests.bench.skills import COST_ANSWER_WORDS, COST_PROMPT

SEQUENTIAL = 100
"""Sequential requests a stack: with 40, the declared mix's Python CPU ratio ranged
0.71-0.75x over three runs in a row on an idle machine, with 100 0.67-0.70x."""
PARALLEL = 8
PARALLEL_REQUESTS = 320
"""Measured at c=PARALLEL, over 4 alternating rounds: with 120 over 3, the declared mix's
Python CPU ratio at c=8 ranged 0.60-0.77x over nine runs on 2026-12-05."""
IDLE_SECONDS = 6.0
"""The idle window whose rate is taken out: periodic work (janitors, registry reads, claims)
makes a short one noisy, by a few commands a request."""
TEXT_CHUNKS = COST_ANSWER_WORDS + 4
SERVICES = ("gateway", "orchestrator", "worker-policy", "worker-audit")


@dataclass
class Snapshot:
    """Counters of Redis and of each service process at one moment."""

    at: float
    commands: Counter[str]
    redis_cpu: float
    reads: int
    cpu: dict[str, float] = field(default_factory=dict)
    usec: Counter[str] = field(default_factory=Counter)
    """Microseconds Redis spent in each command (commandstats `usec`)."""

    def minus(self, other: Snapshot) -> Snapshot:
        return Snapshot(
            self.at - other.at, self.commands - other.commands, self.redis_cpu - other.redis_cpu,
            self.reads - other.reads, {name: self.cpu[name] - other.cpu[name] for name in self.cpu},
            self.usec - other.usec,
        )


async def snapshot(client, pids: dict[str, int]) -> Snapshot:  # type: ignore[no-untyped-def]
    stats = await client.info("commandstats")
    cpu = await client.info("cpu")
    reads = int((await client.info("stats"))["total_reads_processed"])
    commands = Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})
    usec = Counter({name.removeprefix("cmdstat_"): int(v["usec"]) for name, v in stats.items()})
    return Snapshot(
        time.perf_counter(), commands, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), reads,
        {name: cpu_seconds(pid) for name, pid in pids.items()}, usec,
    )


@dataclass
class PerRequest:
    """One request's share of a measured window, the idle rate taken out."""

    commands: dict[str, float]
    redis_cpu_ms: float
    socket_writes: float
    cpu_ms: dict[str, float]
    wall_ms: float
    command_us: dict[str, float]
    """Redis's time in each command, per request."""

    @property
    def total_commands(self) -> float:
        return sum(self.commands.values())

    @property
    def python_cpu_ms(self) -> float:
        return sum(self.cpu_ms.values())


def per_request(window: Snapshot, idle: Snapshot, requests: int) -> PerRequest:
    scale = window.at / idle.at

    def share(counts: Counter[str], idle_counts: Counter[str]) -> dict[str, float]:
        """Each command's count per request, the idle rate taken out (the bench's own
        INFO calls and figures too small to matter left out)."""
        names = set(counts) | set(idle_counts)
        per = {name: (counts[name] - idle_counts[name] * scale) / requests for name in names}
        return {name: n for name, n in per.items() if abs(n) >= 0.05 and name != "info"}

    return PerRequest(
        share(window.commands, idle.commands),
        (window.redis_cpu - idle.redis_cpu * scale) / requests * 1000,
        (window.reads - idle.reads * scale) / requests,
        {name: (window.cpu[name] - idle.cpu[name] * scale) / requests * 1000 for name in window.cpu},
        window.at / requests * 1000,
        share(window.usec, idle.usec),
    )


UNDECLARED = {"policy": ["tests.bench.skills:CostPolicy"], "audit": ["tests.bench.skills:CostAudit"]}
"""The cost mix's worker groups, every hook on the request's path."""


async def start_stack(
    procs: Processes, redis_url: str, prefix: str, model_url: str, groups: dict[str, list[str]] | None = None,
    agent: str = "tests.bench.skills:cost_agent",
) -> tuple[str, dict[str, int]]:
    """The service processes (one worker replica per group of `groups`, default the cost
    mix's; the orchestrator running `agent`), the orchestrator's model at `model_url`;
    returns the gateway's base URL and the pids by name."""
    from hookbus.bus.keys import Keys
    from tests.bench.full import wait_for_orchestrator

    groups = UNDECLARED if groups is None else groups
    pids = {
        f"worker-{group}": procs.worker(redis_url, prefix, group, specs, concurrency=32).pid
        for group, specs in groups.items()
    }
    if groups:
        await wait_for_replicas(redis_url, prefix, dict.fromkeys(groups, 1), procs)
    orchestrator = procs.spawn(
        [PYTHON, "-m", "hookbus.services.cli.main", "orchestrator", "--agent", agent],
        bench_env(redis_url, prefix, OPENAI_BASE_URL=model_url, OPENAI_API_KEY="bench"), "orchestrator",
    )
    pids["orchestrator"] = orchestrator.pid
    port = free_port()
    gateway = procs.spawn(
        [PYTHON, "-m", "hookbus.services.cli.main", "gateway", "--port", str(port)],
        bench_env(redis_url, prefix), "gateway",
    )
    pids["gateway"] = gateway.pid
    from hookbus.bus.client import HookbusClient

    client = HookbusClient(redis_url, prefix=prefix)
    try:
        await wait_for_orchestrator(client, Keys(prefix), procs)
    finally:
        await client.close()
    base = f"http://127.0.0.1:{port}/v1"
    await wait_for_http(f"{base}/models", procs)
    return base, pids


@dataclass(frozen=True)
class Request:
    """What a bench client asks, and how many words its streamed answer has."""

    prompt: str
    words: int


COST_REQUEST = Request(COST_PROMPT, TEXT_CHUNKS)
"""The demo-like request: a tool round, then a 20-word answer."""
PLAIN_REQUEST = Request("[[words:20]]", 20)
"""A streamed 20-word answer and nothing else: one LLM call, no tool (the request of the
peer benches, where a request's own commands weigh more beside its hooks)."""


async def one_request(openai_client, request: Request = COST_REQUEST) -> str:  # type: ignore[no-untyped-def]
    """One streamed request as a client makes it; checks the answer; returns its id."""
    stream = await openai_client.chat.completions.create(
        model="offline", messages=[{"role": "user", "content": request.prompt}], stream=True,
    )
    words, finishes, completion_id = 0, 0, ""
    async for chunk in stream:
        completion_id = chunk.id
        if chunk.choices and chunk.choices[0].delta.content:
            words += len(chunk.choices[0].delta.content.split())
        if chunk.choices and chunk.choices[0].finish_reason:
            finishes += 1
    if words != request.words or finishes != 1:
        raise RuntimeError(f"expected {request.words} words and one finish, got {words} and {finishes}")
    return completion_id


async def hops_of(client, prefix: str, completion_ids: set[str]) -> Counter[str]:  # type: ignore[no-untyped-def]
    """Hops per lifecycle of these requests, from the workers' monitor records."""
    from hookbus.bus.keys import Keys
    from hookbus.bus.wire.envelopes import monitor_records

    hops: Counter[str] = Counter()
    for _, fields in await client.xrange(Keys(prefix).events):
        for record in monitor_records(fields):
            if record.kind == "hop" and record.completion_id in completion_ids:
                hops[record.lifecycle] += 1
    return hops


async def observed_by(client, prefix: str, completion_ids: set[str]) -> dict[str, set[str]]:  # type: ignore[no-untyped-def]
    """The observer hooks each of these requests was observed by (the workers' `observe`
    monitor records, written once the observers of a lifecycle ran)."""
    from hookbus.bus.keys import Keys
    from hookbus.bus.wire.envelopes import monitor_records

    seen: dict[str, set[str]] = {cid: set() for cid in completion_ids}
    for _, fields in await client.xrange(Keys(prefix).events):
        for record in monitor_records(fields):
            if record.kind == "observe" and record.completion_id in seen:
                seen[record.completion_id].update(record.hooks)
    return seen


@dataclass
class Loaded:
    """A stack's figures at c=PARALLEL, the idle rate taken out."""

    rate: float
    """Streamed requests/s."""
    commands: float
    """Redis commands per request."""
    python_cpu_ms: float
    """Python CPU per request, all service processes."""
    by_command: dict[str, float] = field(default_factory=dict)
    """Redis commands per request, by command."""


@dataclass
class CostResult:
    cost: PerRequest
    idle: Snapshot
    hops: Counter[str]
    requests: int
    rate: float
    observers: set[str] = field(default_factory=set)
    """Observer hooks every measured request was observed by (empty: none declared)."""
    loaded: Loaded | None = None
    """The same stack at c=PARALLEL."""


@dataclass
class Stack:
    """One running stack: its Redis, key prefix, gateway and service pids."""

    redis_url: str
    prefix: str
    base: str
    pids: dict[str, int]


async def run_costs(
    redis_url: str, mixes: Sequence[dict[str, list[str]] | None], request: Request = COST_REQUEST
) -> list[CostResult]:
    """One stack per mix (the first on `redis_url`, each other on a Redis of its own, so
    every command counts for its stack), measured in the same windows with their
    requests alternating, so a machine that other work slows down slows every mix alike."""
    from hookbus.bus.connection.embedded import EmbeddedRedis
    from hookbus.services.testing.offline_server import OfflineModelServer

    servers = [EmbeddedRedis(appendonly=False) for _ in mixes[1:]]
    try:
        urls = [redis_url]
        for server in servers:
            server.start()
            urls.append(server.url)
        # the model runs in this process (a thread), as an LLM provider would run elsewhere:
        # its CPU is not the services'
        with OfflineModelServer() as model:
            async with processes() as procs:
                stacks = []
                for url, groups in zip(urls, mixes, strict=True):
                    prefix = new_prefix("cost")
                    base, pids = await start_stack(procs, url, prefix, model.base_url, groups)
                    stacks.append(Stack(url, prefix, base, pids))
                return await _measure_stacks(stacks, request)
    finally:
        for server in servers:
            server.cleanup()


async def _measure_stacks(stacks: list[Stack], request: Request) -> list[CostResult]:
    import openai

    from hookbus.bus.connection.retrying import connect

    redis = [connect(stack.redis_url) for stack in stacks]
    clients = [openai.AsyncOpenAI(base_url=stack.base, api_key="bench", max_retries=0) for stack in stacks]

    async def snapshots() -> list[Snapshot]:
        return [await snapshot(r, stack.pids) for r, stack in zip(redis, stacks, strict=True)]

    try:
        for _ in range(3):
            for client in clients:
                await one_request(client, request)
        await asyncio.sleep(0.5)  # let the warm-up's monitor records and acks settle
        before = await snapshots()
        await asyncio.sleep(IDLE_SECONDS)
        idle = [after.minus(b) for after, b in zip(await snapshots(), before, strict=True)]
        requests = scaled(SEQUENTIAL)
        ids: list[set[str]] = [set() for _ in stacks]
        walls = [0.0 for _ in stacks]
        before = await snapshots()
        for _ in range(requests):
            for n, client in enumerate(clients):
                began = time.perf_counter()
                ids[n].add(await one_request(client, request))
                walls[n] += time.perf_counter() - began
        # the last requests' records, acks and finalize writes, and their observers (a
        # replica reads its observer stream once per LINGER): the idle rate is taken out
        # of the whole window, settling included
        await asyncio.sleep(0.3 + LINGER)
        windows = [after.minus(b) for after, b in zip(await snapshots(), before, strict=True)]
        costs = []
        for window, quiet, wall in zip(windows, idle, walls, strict=True):
            cost = per_request(window, quiet, requests)
            cost.wall_ms = wall / requests * 1000
            costs.append(cost)
        await asyncio.sleep(0.5)  # the observers of the last requests, and their records
        hops = [await hops_of(r, stack.prefix, i) for r, stack, i in zip(redis, stacks, ids, strict=True)]
        observers = []
        for r, stack, i in zip(redis, stacks, ids, strict=True):
            observed = await observed_by(r, stack.prefix, i)
            observers.append(set.intersection(*observed.values()) if observed else set())
        loaded = await _rates(clients, redis, stacks, idle, request)
    finally:
        for client in clients:
            await client.close()
        for r in redis:
            await r.aclose()
    return [
        CostResult(cost, quiet, hop, requests, load.rate, seen, load)
        for cost, quiet, hop, load, seen in zip(costs, idle, hops, loaded, observers, strict=True)
    ]


async def _rates(
    clients: Sequence[object], redis: list[Any], stacks: list[Stack], idle: list[Snapshot], request: Request,
    rounds: int = 4,
) -> list[Loaded]:
    """Each stack at c=PARALLEL, in alternating rounds: its requests/s, and its Redis
    commands and Python CPU per request (what its Redis and processes spent in its own
    rounds), where time-driven work (event flushes, acks, observer reads) is shared by
    more requests than at c=1."""
    per_round = max(PARALLEL, scaled(PARALLEL_REQUESTS) // rounds)
    # the connection pools grow to the concurrency first (each new connection's HELLO and
    # CLIENT SETINFO are not a request's cost): one unmeasured round of PARALLEL each
    for client in clients:
        await asyncio.gather(*(one_request(client, request) for _ in range(PARALLEL)))
    spent = [0.0 for _ in clients]
    windows: list[Snapshot | None] = [None for _ in clients]
    for _ in range(rounds):
        for n, client in enumerate(clients):
            queue = iter(range(per_round))

            async def drive(client: object = client, queue: object = queue) -> None:
                for _ in queue:  # type: ignore[attr-defined]
                    await one_request(client, request)

            before = await snapshot(redis[n], stacks[n].pids)
            began = time.perf_counter()
            await asyncio.gather(*(drive() for _ in range(PARALLEL)))
            spent[n] += time.perf_counter() - began
            window = (await snapshot(redis[n], stacks[n].pids)).minus(before)
            earlier = windows[n]
            windows[n] = window if earlier is None else _sum(earlier, window)
    loaded = []
    for seconds, summed, quiet in zip(spent, windows, idle, strict=True):
        assert summed is not None
        cost = per_request(summed, quiet, rounds * per_round)
        loaded.append(Loaded(rounds * per_round / seconds, cost.total_commands, cost.python_cpu_ms, cost.commands))
    return loaded


def _sum(a: Snapshot, b: Snapshot) -> Snapshot:
    return Snapshot(
        a.at + b.at, a.commands + b.commands, a.redis_cpu + b.redis_cpu, a.reads + b.reads,
        {name: a.cpu[name] + b.cpu[name] for name in a.cpu}, a.usec + b.usec,
    )


def report(result: CostResult) -> list[Row]:
    cost, idle = result.cost, result.idle
    print(f"\n[cost] one streamed request (gateway, orchestrator, 2 worker groups), {result.requests} sequential")
    print(f"  wall {cost.wall_ms:.1f} ms per request; c={PARALLEL}: {result.rate:.1f} requests/s")
    if result.loaded is not None:
        print(f"  at c={PARALLEL}: Redis commands {result.loaded.commands:.1f}, "
              f"Python CPU {result.loaded.python_cpu_ms:.1f} ms per request; by command: "
              + ", ".join(f"{name} {n:.1f}" for name, n in sorted(result.loaded.by_command.items(), key=lambda kv: -kv[1])))
    hops = sum(result.hops.values())
    print(f"  hops {hops / result.requests:.1f} per request: "
          + ", ".join(f"{lc} {n / result.requests:.1f}" for lc, n in sorted(result.hops.items())))
    print(f"  Redis commands {cost.total_commands:.1f} per request "
          f"(Redis's time in them: {sum(cost.command_us.values()) / 1000:.2f} ms):")
    for name, n in sorted(cost.commands.items(), key=lambda kv: -kv[1]):
        print(f"    {name:<12} {n:7.1f}   {cost.command_us.get(name, 0.0):7.1f} us")
    print(f"  socket writes to Redis {cost.socket_writes:.1f} per request (read events of the server)")
    print(f"  Redis CPU {cost.redis_cpu_ms:.2f} ms per request")
    print(f"  Python CPU {cost.python_cpu_ms:.1f} ms per request: "
          + ", ".join(f"{name} {ms:.1f}" for name, ms in cost.cpu_ms.items()))
    idle_commands = sum(idle.commands.values()) / idle.at
    print(f"  idle (subtracted): {idle_commands:.1f} commands/s, Redis CPU {idle.redis_cpu / idle.at * 1000:.2f} ms/s, "
          f"Python CPU {sum(idle.cpu.values()) / idle.at * 1000:.1f} ms/s")
    return [
        Row("cost", "Redis commands per streamed request", cost.total_commands, "", target="<=60"),
        Row("cost", "socket writes to Redis per streamed request", cost.socket_writes, ""),
        Row("cost", "Redis CPU per streamed request", cost.redis_cpu_ms, "ms", target="<=2"),
        Row("cost", "Python CPU per streamed request (all processes)", cost.python_cpu_ms, "ms", target="<=25"),
        Row("cost", "hops per streamed request", hops / result.requests, ""),
        Row("cost", f"streamed requests/s at c={PARALLEL}", result.rate, "req/s"),
    ]


async def measure(redis_url: str) -> list[Row]:
    quiet_logs()
    (undeclared,) = await run_costs(redis_url, [UNDECLARED])
    return report(undeclared)


if __name__ == "__main__":
    run_alone(measure, "cost")
