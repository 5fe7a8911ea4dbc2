"""Bench: hookbus against Portkey's gateway, the same request with the same hook, and
hookbus's hook in a worker group against the same hook in the orchestrator's process.

Both gateways serve `POST /v1/chat/completions` in front of the same stub upstream
(tests.bench.stub_upstream, a process of its own, not counted), driven by the same load
generator (aiohttp in this process, not counted); each request's user message holds the
word the hooks mask (`darn`), and every answer is checked to say whether the model saw
it, so a hook that did not run, or ran where none should, fails the bench. Cases:

- hookbus, no hook: gateway, orchestrator (tests.bench.skills:plain_agent), Redis;
- hookbus, the rewrite in process: the orchestrator runs tests.bench.skills.Rewrite;
- hookbus, the rewrite in a worker group of one replica: plain_agent, and a `hookbus
  worker` running Rewrite (one `before_llm_call` hop a request);
- Portkey 1.15.2 (one node process, tests.bench.portkey), no hook; its `regexReplace`
  mutator (in process); its `webhook` guardrail to tests.bench.portkey_webhook, an HTTP
  server whose CPU is counted with Portkey's.

Each hookbus case has its own Redis (its commands and CPU are its own); the CPU of a case
is that of every process on its path (hookbus: gateway, orchestrator, the worker, Redis;
Portkey: node and the webhook server), per request, from /proc. The six cases take turns
in rounds, ROUNDS of each, streamed and not, at c=1 and c=PARALLEL, after a warm-up of
each (Portkey's first requests cost it more than later ones); figures are the medians of
the rounds. Without node or Portkey's package (`python -m tests.bench.portkey --install`,
which `make bench` runs), Portkey's side is skipped with the reason, hookbus's runs.

Run alone: `python -m tests.bench.gateways`.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from tests.bench import portkey
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
    redis_pid,
    run_alone,
    scaled,
    wait_for_http,
)

ROUNDS = 3
PARALLEL = 8
REQUESTS = {1: 150, PARALLEL: 400}
"""Requests a round at each concurrency."""
WARMUP = 100
IDLE_SECONDS = 5.0
PROMPT = "Tell me something, darn it."
MODEL = "offline"
"""The name hookbus's agents serve by default; the stub answers any name."""
MODES = [(False, 1), (False, PARALLEL), (True, 1), (True, PARALLEL)]
"""(streamed, concurrency) of each measured mode."""
HOOKBUS_CASES = {
    "hookbus, no hook": ("tests.bench.skills:plain_agent", {}),
    "hookbus, rewrite in process": ("tests.bench.skills:rewrite_agent", {}),
    "hookbus, rewrite in a worker group": ("tests.bench.skills:plain_agent", {"rewrite": ["tests.bench.skills:Rewrite"]}),
}
PORTKEY_CASES = ("Portkey, no hook", "Portkey, regexReplace in process", "Portkey, webhook guardrail")
COMPARED = [
    ("hookbus, no hook", "Portkey, no hook", "<=1.5x"),
    ("hookbus, rewrite in process", "Portkey, regexReplace in process", "<=1.5x"),
    ("hookbus, rewrite in a worker group", "Portkey, webhook guardrail", "<=1.0x"),
]
"""(hookbus case, its Portkey peer, the target on their CPU per request)."""


@dataclass
class Case:
    """One way of serving the request: where to send it, with which headers, which
    processes' CPU is its cost, and the Redis whose commands it makes (hookbus)."""

    name: str
    url: str
    headers: dict[str, str]
    pids: dict[str, int]
    expect: str
    """The stub's first word: `clean` when the case's hook masked the word, else `seen`."""
    redis_url: str | None = None


@dataclass
class Round:
    """One round of one case in one mode."""

    rate: float
    cpu_ms: dict[str, float]
    """CPU per request of each process of the case."""
    commands: float = float("nan")
    writes: float = float("nan")
    """Socket writes Redis read per request."""
    p50_ms: float = float("nan")

    @property
    def total_ms(self) -> float:
        return sum(self.cpu_ms.values())


@dataclass
class Figures:
    """A case's rounds in one mode, and their medians."""

    rounds: list[Round] = field(default_factory=list)

    @property
    def cpu_ms(self) -> float:
        return statistics.median(r.total_ms for r in self.rounds)

    @property
    def rate(self) -> float:
        return statistics.median(r.rate for r in self.rounds)

    @property
    def commands(self) -> float:
        return statistics.median(r.commands for r in self.rounds)

    @property
    def writes(self) -> float:
        return statistics.median(r.writes for r in self.rounds)

    @property
    def p50_ms(self) -> float:
        return statistics.median(r.p50_ms for r in self.rounds)

    def part_ms(self, name: str) -> float:
        return statistics.median(r.cpu_ms[name] for r in self.rounds)


async def hookbus_cases(procs: Processes, redis_urls: list[str], upstream: str) -> list[Case]:
    from tests.bench.cost import start_stack

    cases = []
    for (name, (agent, groups)), url in zip(HOOKBUS_CASES.items(), redis_urls, strict=True):
        base, pids = await start_stack(procs, url, new_prefix("gw"), upstream, groups, agent=agent)
        pids["redis"] = redis_pid(url)
        cases.append(Case(name, f"{base}/chat/completions", {}, pids, "clean" if "rewrite" in name else "seen", url))
    return cases


async def portkey_cases(procs: Processes, upstream: str) -> list[Case]:
    port, hook_port = free_port(), free_port()
    node = procs.spawn(portkey.command(port), dict(os.environ), "portkey")
    webhook = procs.spawn([PYTHON, "-m", "tests.bench.portkey_webhook", str(hook_port)], _env(), "portkey-webhook")
    await wait_for_http(f"http://127.0.0.1:{hook_port}/check", procs)
    await _wait_for_port(port, procs)
    pids = {"node": node.pid, "webhook server": webhook.pid}
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    hooks = [None, [portkey.regex_mutator()], [portkey.webhook_guardrail(f"http://127.0.0.1:{hook_port}/check")]]
    return [
        Case(name, url, {"x-portkey-config": portkey.config(upstream, hook)}, pids, "seen" if hook is None else "clean")
        for name, hook in zip(PORTKEY_CASES, hooks, strict=True)
    ]


def _env() -> dict[str, str]:
    """The environment of a process that uses no Redis (the stub, the webhook server)."""
    return bench_env("redis://unused", "unused:")


async def _wait_for_port(port: int, procs: Processes, timeout: float = 60.0) -> None:
    async with asyncio.timeout(timeout):
        while True:
            procs.check_alive()
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                return
            except OSError:
                await asyncio.sleep(0.1)


async def one_request(http: Any, case: Case, streamed: bool) -> None:
    """One chat completion as a client makes it, its answer checked."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "stream": streamed}
    async with http.post(case.url, json=body, headers=case.headers) as response:
        raw = await response.read()
    if response.status != 200:
        raise RuntimeError(f"{case.name}: HTTP {response.status}: {raw[:300]!r}")
    if streamed:
        if not raw.rstrip().endswith(b"[DONE]") or case.expect.encode() not in raw:
            raise RuntimeError(f"{case.name}: a stream without {case.expect!r} or [DONE]: {raw[-300:]!r}")
        return
    content = json.loads(raw)["choices"][0]["message"]["content"]
    if content.split()[0] != case.expect:
        raise RuntimeError(f"{case.name}: expected {case.expect!r} first, got {content[:80]!r}")


async def _counts(url: str) -> tuple[int, int]:
    """Commands Redis ran so far, and socket writes it read (`total_reads_processed`: one per
    client write that reached it, so a pipeline is one however many commands it holds)."""
    from hookbus.bus.connection.retrying import connect

    client = connect(url)
    try:
        stats = await client.info("commandstats")
        reads = int((await client.info("stats"))["total_reads_processed"])
    finally:
        await client.aclose()
    return sum(int(v["calls"]) for v in stats.values()), reads


INFO_COST = (2, 2)
"""What one `_counts` adds to the next: its two INFO commands, in two writes."""


@dataclass
class Idle:
    """What each process spends per second, and each Redis gets in commands per second,
    with no request: heartbeats, registry reads, claims, janitors (hookbus; Portkey has
    none to speak of). Taken out of a round at its rate, so a case's CPU per request is
    the request's own, not a share of the time-driven work that depends on how long the
    round took (at c=1, on a loaded machine, that varies several times over)."""

    cpu: dict[int, float]
    """pid -> CPU seconds per second."""
    commands: dict[str, tuple[float, float]]
    """Redis URL -> (commands, socket writes) per second."""


async def idle_rates(cases: list[Case], seconds: float = IDLE_SECONDS) -> Idle:
    pids = {pid for case in cases for pid in case.pids.values()}
    urls = {case.redis_url for case in cases if case.redis_url}
    cpu = {pid: cpu_seconds(pid) for pid in pids}
    counts = {url: await _counts(url) for url in urls}
    began = time.perf_counter()
    await asyncio.sleep(seconds)
    wall = time.perf_counter() - began
    return Idle(
        {pid: (cpu_seconds(pid) - cpu[pid]) / wall for pid in pids},
        {url: _rates(counts[url], await _counts(url), wall) for url in urls},
    )


async def measure_round(http: Any, case: Case, streamed: bool, concurrency: int, total: int, idle: Idle) -> Round:
    remaining = iter(range(total))
    latencies: list[float] = []

    async def drive() -> None:
        for _ in remaining:
            began = time.perf_counter()
            await one_request(http, case, streamed)
            latencies.append(time.perf_counter() - began)

    counts = await _counts(case.redis_url) if case.redis_url else None
    cpu = {name: cpu_seconds(pid) for name, pid in case.pids.items()}
    began = time.perf_counter()
    await asyncio.gather(*(drive() for _ in range(concurrency)))
    wall = time.perf_counter() - began
    spent = {
        name: (cpu_seconds(pid) - cpu[name] - idle.cpu[pid] * wall) / total * 1000 for name, pid in case.pids.items()
    }
    made = (float("nan"), float("nan"))
    if case.redis_url and counts is not None:
        rates = _rates(counts, await _counts(case.redis_url), wall)
        quiet = idle.commands[case.redis_url]
        made = ((rates[0] - quiet[0]) * wall / total, (rates[1] - quiet[1]) * wall / total)
    return Round(total / wall, spent, *made, statistics.median(latencies) * 1000)


def _rates(before: tuple[int, int], after: tuple[int, int], seconds: float) -> tuple[float, float]:
    """Commands and socket writes per second between two `_counts`, theirs left out."""
    return tuple((a - b - cost) / seconds for a, b, cost in zip(after, before, INFO_COST, strict=True))  # type: ignore[return-value]


async def run_cases(cases: list[Case]) -> dict[tuple[bool, int], dict[str, Figures]]:
    import aiohttp

    results: dict[tuple[bool, int], dict[str, Figures]] = {mode: {c.name: Figures() for c in cases} for mode in MODES}
    connector = aiohttp.TCPConnector(limit=PARALLEL * 2)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as http:
        for case in cases:  # warm-up, both modes
            for streamed in (False, True):
                await asyncio.gather(*(one_request(http, case, streamed) for _ in range(scaled(WARMUP) // 2)))
        idle = await idle_rates(cases)
        report_idle(cases, idle)
        for streamed, concurrency in MODES:
            total = scaled(REQUESTS[concurrency])
            for _ in range(ROUNDS):
                for case in cases:
                    figures = await measure_round(http, case, streamed, concurrency, total, idle)
                    results[(streamed, concurrency)][case.name].rounds.append(figures)
    return results


def report_idle(cases: list[Case], idle: Idle) -> None:
    print("\n[gateways] with no request (taken out of every round at its rate), CPU ms/s: " + "; ".join(
        f"{case.name}: " + ", ".join(f"{name} {idle.cpu[pid] * 1000:.1f}" for name, pid in case.pids.items())
        + (f", {idle.commands[case.redis_url][0]:.1f} Redis commands/s" if case.redis_url else "")
        for case in cases
    ))


def _mode(streamed: bool, concurrency: int) -> str:
    return f"{'streamed' if streamed else 'not streamed'}, c={concurrency}"


def report(results: dict[tuple[bool, int], dict[str, Figures]], skipped: str | None) -> list[Row]:
    rows: list[Row] = []
    print(f"\n[gateways] CPU per request (ms, every process on the path), medians of {ROUNDS} alternated rounds")
    for mode, by_case in results.items():
        print(f"  {_mode(*mode)}:")
        for name, figures in by_case.items():
            parts = ", ".join(f"{part} {figures.part_ms(part):.2f}" for part in figures.rounds[0].cpu_ms)
            commands = "" if figures.commands != figures.commands else (
                f", Redis: {figures.commands:.1f} commands in {figures.writes:.1f} socket writes")
            print(f"    {name:<36} {figures.cpu_ms:6.2f} ms  {figures.rate:7.1f} req/s  p50 {figures.p50_ms:6.2f} ms"
                  f"  ({parts}{commands})")
    for mode, by_case in results.items():
        label = _mode(*mode)
        remote, local = by_case["hookbus, rewrite in a worker group"], by_case["hookbus, rewrite in process"]
        rows.append(Row("gateways", f"{label}: worker-group hook CPU/request", remote.cpu_ms, "ms",
                        local.cpu_ms, "hook in process", target="<=1.3x"))
        rows.append(Row("gateways", f"{label}: worker-group hook Redis commands/request", remote.commands, "",
                        local.commands, "hook in process"))
        rows.append(Row("gateways", f"{label}: worker-group hook socket writes to Redis/request", remote.writes, "",
                        local.writes, "hook in process"))
        if skipped is not None:
            continue
        for ours, theirs, target in COMPARED:
            rows.append(Row("gateways", f"{label}: {ours} CPU/request", by_case[ours].cpu_ms, "ms",
                            by_case[theirs].cpu_ms, theirs, target=target))
        if mode == (False, PARALLEL):
            for ours, theirs, _ in COMPARED:
                rows.append(Row("gateways", f"{label}: {ours} req/s", by_case[ours].rate, "req/s",
                                by_case[theirs].rate, theirs, target=">=1x"))
    if skipped is not None:
        print(f"  Portkey's side skipped: {skipped}")
    return rows


async def measure(redis_url: str) -> list[Row]:
    from hookbus.bus.connection.embedded import EmbeddedRedis

    quiet_logs()
    skipped = portkey.missing()
    servers = [EmbeddedRedis(appendonly=False) for _ in range(len(HOOKBUS_CASES) - 1)]
    try:
        for server in servers:
            server.start()
        async with processes() as procs:
            upstream_port = free_port()
            procs.spawn([PYTHON, "-m", "tests.bench.stub_upstream", str(upstream_port)], _env(), "stub-upstream")
            upstream = f"http://127.0.0.1:{upstream_port}/v1"
            await wait_for_http(f"{upstream}/models", procs)
            cases = await hookbus_cases(procs, [redis_url, *(s.url for s in servers)], upstream)
            if skipped is None:
                cases += await portkey_cases(procs, upstream)
            results = await run_cases(cases)
    finally:
        for server in servers:
            server.cleanup()
    return report(results, skipped)


if __name__ == "__main__":
    run_alone(measure, "gateways: hookbus against Portkey, and the hop against the hook in process")
