"""Bench: what an open web console costs the bus at 1,000 requests a minute, and how
responsive it stays under that load.

The stack: a real `hookbus gateway`, an orchestrator (the cost bench's agent) and one
worker group `audit` as processes (tests.bench.skills.CostAudit: hooks on on_connection,
before_toolcall and finalize_connection, so a request makes two hops), the offline model
in a process of its own. The request mix is light, so that this machine can sustain the
rate: a non-streamed chat completion ("Say hello.": one LLM call, no tool call) through
the openai client, started on schedule (open loop: RATE a minute, whether or not the last
one ended).

In one run, on one stack, in this order:

1. idle, nobody watching: the bus's own commands per second (heartbeats, reads, claims);
2. under the load, ROUNDS rounds of: a slice with no console; then VIEWERS live streams
   opened as the page keeps them (`GET /console/api/live` on the gateway, re-opened at once
   each time the server ends one) and a probe that opens the requests list and the newest
   request's waterfall every PROBE_EVERY seconds, as a person clicking through would, and
   after WARM_UP a slice with them; then nobody watches until the console's reader has
   stopped (IDLE_AFTER). Each arm is measured for WINDOW seconds in all, in slices that
   alternate, so that other work on this machine slows both arms alike;
3. idle, the viewers open again: the console's own commands per second (3 less 1).

Redis commands are INFO commandstats deltas (the bench's own INFO calls left out), CPU
Redis's INFO cpu and each service process's /proc counters over the same slices.
Reported side by side for the two arms: the achieved request rate (it must really be
RATE), Redis commands a second and per finished request (target: at most 1.02x), the CPU
of Redis and of each process (the gateway serves the console) as a share of one core, at
rest and under the load; the console's own commands per second, and its responsiveness under load: the probe's
latencies (requests list, waterfall) and how long a finished request took to appear as
finished in a viewer's live stream (from when its client got the answer), p50 and p95.

Run alone: `python -m tests.bench.console` (BENCH_CONSOLE_WINDOW seconds per load window,
default 60; BENCH_CONSOLE_RATE requests a minute, default 1000).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from hookbus.services.console.data import IDLE_AFTER, POLL_EVERY
from tests.bench.common import Row, Stats, quick, run_alone
from tests.bench.cost import snapshot, start_stack

TARGET_RATE = 1_000
"""Requests a minute the 2% target is stated for."""
RATE = int(os.environ.get("BENCH_CONSOLE_RATE", str(TARGET_RATE)))
WINDOW = float(os.environ.get("BENCH_CONSOLE_WINDOW", "12" if quick() else "60"))
"""Seconds each arm is measured, in ROUNDS slices."""
ROUNDS = 3
IDLE_WINDOW = min(15.0, WINDOW)
VIEWERS = 3
WARM_UP = 5.0
"""Seconds a load (or the viewers' first poll and its backfill) gets before a window."""
PROBE_EVERY = 1.0
LIGHT_MIX = {"audit": ["tests.bench.skills:CostAudit"]}
PROMPT = "Say hello."


@dataclass
class Load:
    """RATE requests a minute, each started on time whether or not the last one ended;
    when each finished (perf_counter) and how long it took."""

    client: Any
    finished_at: dict[str, float] = field(default_factory=dict)
    latencies: list[tuple[float, float]] = field(default_factory=list)
    """(when it finished, seconds it took)."""
    failed: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def one(self) -> None:
        started = time.perf_counter()
        try:
            completion = await self.client.chat.completions.create(
                model="offline", messages=[{"role": "user", "content": PROMPT}]
            )
            if not completion.choices[0].message.content:
                raise RuntimeError("an empty answer")
        except Exception as exc:  # noqa: BLE001 - counted: the bench reports failures, it does not stop
            self.failed += 1
            self.errors[f"{type(exc).__name__} {getattr(exc, 'status_code', '')}".strip()] += 1
            return
        ended = time.perf_counter()
        self.finished_at[completion.id] = ended
        self.latencies.append((ended, ended - started))

    def finished_between(self, start: float, end: float) -> list[float]:
        """Latencies (s) of the requests that finished in [start, end)."""
        return [took for at, took in self.latencies if start <= at < end]

    async def run(self) -> None:
        every = 60.0 / RATE
        next_at = time.perf_counter()
        while True:
            task = asyncio.create_task(self.one())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            next_at += every
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))

    async def drain(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def driven(load: Load) -> AsyncIterator[None]:
    driver = asyncio.create_task(load.run())
    try:
        yield
    finally:
        driver.cancel()
        await asyncio.gather(driver, return_exceptions=True)
        await load.drain()


@dataclass
class Viewers:
    """What the viewers saw: when each request first showed as finished (perf_counter),
    frames per viewer, and the probe's latencies."""

    seen_finished: dict[str, float] = field(default_factory=dict)
    frames: list[int] = field(default_factory=list)
    list_latency: list[float] = field(default_factory=list)
    waterfall_latency: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def frame(self, viewer: int, snapshot: dict[str, Any]) -> None:
        arrived = time.perf_counter()
        self.frames[viewer] += 1
        for request in snapshot["requests"]:
            if request["outcome"] != "running":
                self.seen_finished.setdefault(request["completion_id"], arrived)


async def watch(console_url: str, n: int, seen: Viewers) -> None:
    """One viewer, as the page: a live stream, re-opened at once when the server ends it,
    2 s after a refusal (the gateway answers 503 to an address holding too many
    connections: the load's own, when this machine stalls) or a broken stream."""
    async with httpx.AsyncClient(timeout=None) as http:
        while True:
            try:
                async with http.stream("GET", f"{console_url}/api/live") as response:
                    response.raise_for_status()
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            seen.frame(n, json.loads(line[6:]))
                continue
            except httpx.HTTPError as exc:
                seen.errors[f"live: {type(exc).__name__}"] += 1
            await asyncio.sleep(2.0)


async def probe(console_url: str, seen: Viewers) -> None:
    """A person clicking through: the requests list, then the newest request's waterfall."""
    async with httpx.AsyncClient(base_url=console_url, timeout=30) as http:
        while True:
            round_began = began = time.perf_counter()
            try:
                listed = (await http.get("/api/requests")).raise_for_status().json()
                seen.list_latency.append(time.perf_counter() - began)
                done = [r["completion_id"] for r in listed if r["outcome"] != "running"]
                if done:
                    began = time.perf_counter()
                    (await http.get(f"/api/requests/{done[0]}")).raise_for_status()
                    seen.waterfall_latency.append(time.perf_counter() - began)
            except httpx.HTTPError as exc:
                seen.errors[f"probe: {type(exc).__name__}"] += 1
            await asyncio.sleep(max(0.0, PROBE_EVERY - (time.perf_counter() - round_began)))


@contextlib.asynccontextmanager
async def viewers(console_url: str, seen: Viewers) -> AsyncIterator[Viewers]:
    tasks = [asyncio.create_task(watch(console_url, n, seen)) for n in range(VIEWERS)]
    tasks.append(asyncio.create_task(probe(console_url, seen)))
    try:
        yield seen
    finally:
        for task in tasks:
            task.cancel()
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(outcome, Exception):
                raise outcome


@dataclass
class Window:
    """Redis commands and CPU, each process's CPU and finished requests over one or more
    slices of time."""

    seconds: float
    commands: float
    redis_cpu: float
    """Seconds of CPU the Redis server used (INFO cpu, user + system)."""
    cpu: dict[str, float]
    """Seconds of CPU each service process used (the gateway serves the console)."""
    latencies: list[float]
    """Of the requests that finished in it (s)."""
    spans: list[tuple[float, float]]
    """Its slices (perf_counter start, end)."""

    @classmethod
    def merged(cls, parts: list[Window]) -> Window:
        return cls(
            sum(w.seconds for w in parts), sum(w.commands for w in parts), sum(w.redis_cpu for w in parts),
            {name: sum(w.cpu[name] for w in parts) for name in parts[0].cpu},
            [x for w in parts for x in w.latencies], [span for w in parts for span in w.spans],
        )

    def busy(self, seconds: float) -> float:
        """A CPU time as the share of one core over this window."""
        return seconds / self.seconds

    @property
    def requests(self) -> int:
        return len(self.latencies)

    @property
    def per_minute(self) -> float:
        return self.requests / self.seconds * 60

    @property
    def per_request(self) -> float:
        return self.commands / self.requests

    @property
    def per_second(self) -> float:
        return self.commands / self.seconds

    def at_target(self, idle: Window) -> float:
        """Commands a second at TARGET_RATE: the idle bus's rate plus this window's commands
        beyond it per finished request, times the target rate. The two arms seldom
        finish exactly as many requests (other work slows this machine at times), and the
        bus's background commands (heartbeats, blocked reads timing out) follow the clock,
        not the requests: this puts both arms at one rate."""
        per_request = (self.commands - idle.per_second * self.seconds) / self.requests
        return idle.per_second + per_request * TARGET_RATE / 60


async def window(redis: Any, pids: dict[str, int], load: Load, seconds: float) -> Window:
    before = await snapshot(redis, pids)
    await asyncio.sleep(seconds)
    after = await snapshot(redis, pids)
    delta = after.minus(before)
    return Window(
        delta.at, sum(n for name, n in delta.commands.items() if name != "info"), delta.redis_cpu, delta.cpu,
        load.finished_between(before.at, after.at), [(before.at, after.at)],
    )


def pct(values: list[float], q: float) -> float:
    return Stats(values, 1.0).pct(q)


def ms(values: list[float]) -> str:
    return f"p50 {pct(values, 50) * 1000:.0f} ms, p95 {pct(values, 95) * 1000:.0f} ms (n={len(values)})"


async def measure(redis_url: str) -> list[Row]:
    import openai

    from hookbus.bus.connection.retrying import connect
    from tests.bench.common import new_prefix, processes

    async with processes() as procs:
        model_url = await procs.model()
        base, pids = await start_stack(procs, redis_url, new_prefix("console"), model_url, LIGHT_MIX)
        console_url = base.removesuffix("/v1") + "/console"
        redis = connect(redis_url)
        client = openai.AsyncOpenAI(base_url=base, api_key="bench", max_retries=0)
        load = Load(client)
        seen = Viewers(frames=[0] * VIEWERS)
        without: list[Window] = []
        watched: list[Window] = []
        try:
            for _ in range(5):
                await load.one()
            idle = await window(redis, pids, load, IDLE_WINDOW)
            async with driven(load):
                await asyncio.sleep(WARM_UP)
                for _ in range(ROUNDS):
                    without.append(await window(redis, pids, load, WINDOW / ROUNDS))
                    async with viewers(console_url, seen):
                        await asyncio.sleep(WARM_UP)
                        watched.append(await window(redis, pids, load, WINDOW / ROUNDS))
                    await asyncio.sleep(IDLE_AFTER + POLL_EVERY + 1)  # the poller stops once nobody watches
            idle_seen = Viewers(frames=[0] * VIEWERS)
            async with viewers(console_url, idle_seen):
                await asyncio.sleep(WARM_UP)
                idle_watched = await window(redis, pids, load, IDLE_WINDOW)
        finally:
            await client.close()
            await redis.aclose()
    return report(idle, idle_watched, Window.merged(without), Window.merged(watched), load, seen)


def side_by_side(without: Window, watched: Window, idle: Window, idle_watched: Window) -> str:
    """The two arms under load, figure by figure, and the console's own at rest: what each
    process and Redis spent, as a share of one core."""
    rows: list[tuple[str, str, str]] = [
        ("requests finished a minute", f"{without.per_minute:.0f}", f"{watched.per_minute:.0f}"),
        ("Redis commands a second", f"{without.per_second:.0f}", f"{watched.per_second:.0f}"),
        ("Redis commands per request", f"{without.per_request:.2f}", f"{watched.per_request:.2f}"),
        ("Redis CPU", f"{without.busy(without.redis_cpu):.1%}", f"{watched.busy(watched.redis_cpu):.1%}"),
    ]
    rows += [
        (f"{name} CPU" + (" (serves the console)" if name == "gateway" else ""),
         f"{without.busy(without.cpu[name]):.1%}", f"{watched.busy(watched.cpu[name]):.1%}")
        for name in without.cpu
    ]
    rows += [
        ("Python CPU, all services", f"{without.busy(sum(without.cpu.values())):.1%}",
         f"{watched.busy(sum(watched.cpu.values())):.1%}"),
        ("request latency p50 / p95", f"{pct(without.latencies, 50) * 1000:.0f} / {pct(without.latencies, 95) * 1000:.0f} ms",
         f"{pct(watched.latencies, 50) * 1000:.0f} / {pct(watched.latencies, 95) * 1000:.0f} ms"),
        ("at rest: commands a second", f"{idle.per_second:.1f}", f"{idle_watched.per_second:.1f}"),
        ("at rest: gateway CPU", f"{idle.busy(idle.cpu['gateway']):.2%}", f"{idle_watched.busy(idle_watched.cpu['gateway']):.2%}"),
        ("at rest: Redis CPU", f"{idle.busy(idle.redis_cpu):.2%}", f"{idle_watched.busy(idle_watched.redis_cpu):.2%}"),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"  {'':<{width}}  {'no console':>14}  {f'{VIEWERS} viewers':>14}"]
    lines += [f"  {label:<{width}}  {a:>14}  {b:>14}" for label, a, b in rows]
    return "\n".join(lines)


def report(idle: Window, idle_watched: Window, without: Window, watched: Window, load: Load, seen: Viewers) -> list[Row]:
    shown_after = [
        seen.seen_finished[cid] - at for cid, at in load.finished_at.items()
        if any(start <= at < end for start, end in watched.spans) and cid in seen.seen_finished
    ]
    missed = sum(
        1 for cid, at in load.finished_at.items()
        if any(start <= at < end - 5 for start, end in watched.spans) and cid not in seen.seen_finished
    )
    console_idle = idle_watched.per_second - idle.per_second
    at_target = (without.at_target(idle), watched.at_target(idle))
    print(
        f"\n[console] light mix (non-streamed, 1 LLM call, 2 hops to `audit`), {RATE} requests/min offered, "
        f"{ROUNDS} rounds of {WINDOW / ROUNDS:.0f} s without and {WINDOW / ROUNDS:.0f} s with {VIEWERS} viewers; "
        f"failed requests: {load.failed} {dict(load.errors)}\n"
        f"  idle: {idle.per_second:.1f} commands/s; with {VIEWERS} viewers open {idle_watched.per_second:.1f}/s: "
        f"the console's own {console_idle:.1f}/s\n"
    )
    print(side_by_side(without, watched, idle, idle_watched))
    print(
        f"  ratio of commands per request: {watched.per_request / without.per_request:.4f}; at {TARGET_RATE}/min "
        f"exactly (idle rate + per request beyond it): {at_target[0]:.0f} and {at_target[1]:.0f} commands/s, "
        f"{at_target[1] / at_target[0]:.4f}\n"
        f"  frames per viewer: {seen.frames}; viewer errors: {dict(seen.errors)}; requests list {ms(seen.list_latency)}; waterfall {ms(seen.waterfall_latency)}\n"
        f"  a finished request showed as finished in a live stream after p50 {pct(shown_after, 50):.2f} s, "
        f"p95 {pct(shown_after, 95):.2f} s (n={len(shown_after)}; never shown: {missed})"
    )
    return [
        Row("console", "requests/min achieved, no console", without.per_minute, "req/min", target=f">= {RATE * 0.95:.0f}"),
        Row("console", f"requests/min achieved, {VIEWERS} viewers", watched.per_minute, "req/min", target=f">= {RATE * 0.95:.0f}"),
        Row("console", "commands per request, no console", without.per_request, "commands"),
        Row(
            "console", f"commands per request, {VIEWERS} viewers", watched.per_request, "commands",
            baseline=without.per_request, baseline_name="no console", target="<= 1.02x",
        ),
        Row(
            "console", f"commands/s at exactly {TARGET_RATE}/min, {VIEWERS} viewers", at_target[1], "commands/s",
            baseline=at_target[0], baseline_name="no console", target="<= 1.02x",
        ),
        Row("console", "the console's own commands/s (idle, viewers open)", console_idle, "commands/s"),
        Row(
            "console", f"gateway (console) CPU under load, {VIEWERS} viewers", watched.busy(watched.cpu["gateway"]) * 100,
            "% core", baseline=without.busy(without.cpu["gateway"]) * 100, baseline_name="no console",
        ),
        Row(
            "console", f"Redis CPU under load, {VIEWERS} viewers", watched.busy(watched.redis_cpu) * 100, "% core",
            baseline=without.busy(without.redis_cpu) * 100, baseline_name="no console",
        ),
        Row(
            "console", f"Redis commands/s under load, {VIEWERS} viewers", watched.per_second, "commands/s",
            baseline=without.per_second, baseline_name="no console",
        ),
        Row("console", "requests list latency p95 under load", pct(seen.list_latency, 95) * 1000, "ms"),
        Row("console", "waterfall latency p95 under load", pct(seen.waterfall_latency, 95) * 1000, "ms"),
        Row("console", "finished request shown live after, p95", pct(shown_after, 95), "s"),
        Row(
            "console", f"request latency p50, {VIEWERS} viewers", pct(watched.latencies, 50) * 1000, "ms",
            baseline=pct(without.latencies, 50) * 1000, baseline_name="no console",
        ),
    ]


if __name__ == "__main__":
    run_alone(measure, "console")
