"""The chaos run: requests through two worker groups of three replicas each and two
orchestrators, all real `hookbus` processes, while worker replicas and an orchestrator
are killed with SIGKILL at random (seeded) moments and restarted under the same name, as
a supervisor (Kubernetes) would.

Checked at the end, and printed:
- every request got exactly one terminal response item (nothing after it), none is lost;
- finalize_connection ran at least once for every request, and exactly once for every
  request no kill touched (no kill while it was in flight); counted by an in-process
  finalize hook of the orchestrators' agent (`tests.faults.fault_skills:LocalLedger`);
- no entry is left pending in `requests` or in either group's stream.

    python -m tests.bench.chaos                       # 1000 requests, ~2 minutes
    python -m tests.bench.chaos --requests 200 --seed 3 --rate 10

The test tests/faults/test_chaos.py runs the same with 200 requests.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio as aredis

from hookbus.bus.keys import ORCHESTRATOR_GROUP, Keys
from hookbus.bus.store.response_stream import TERMINAL_KINDS
from tests.faults.fault_skills import fault_key
from tests.faults.helpers import Outcome, read_until_terminal, stored_items, submit, version_stream
from tests.integration.processes import Proc, Processes

AGENT = "tests.faults.fault_skills:agent"
GROUPS = {
    "alpha": ("tests.faults.fault_skills:Touch", "tests.faults.fault_skills:Ledger"),
    "beta": ("tests.faults.fault_skills:Stamp",),
}


@dataclass
class ChaosConfig:
    requests: int = 200
    seed: int = 7
    rate: float = 8.0
    """Requests submitted per second."""
    replicas: int = 3
    replica_kills: int = 6
    orchestrator_kills: int = 1
    restart_after: float = 1.5
    worker_claim_idle: float = 1.5
    orchestrator_claim_idle: float = 2.0
    request_timeout: float = 90.0
    settle: float = 30.0


@dataclass
class Kill:
    at: float
    name: str
    role: str


@dataclass
class ChaosReport:
    config: ChaosConfig
    duration: float = 0.0
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    submitted: dict[str, float] = field(default_factory=dict)
    kills: list[Kill] = field(default_factory=list)
    terminals: dict[str, int] = field(default_factory=dict)
    after_terminal: dict[str, int] = field(default_factory=dict)
    finalize: dict[str, int] = field(default_factory=dict)
    remote_finalize: dict[str, int] = field(default_factory=dict)
    recovered: dict[str, bool] = field(default_factory=dict)
    pending: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    logs: str = ""

    # ------------------------------------------------------------ verdicts

    def touched(self, cid: str) -> bool:
        """A kill happened while the request was in flight."""
        outcome = self.outcomes[cid]
        end = outcome.ended if outcome.ended is not None else float("inf")
        return any(self.submitted[cid] <= k.at <= end for k in self.kills)

    @property
    def lost(self) -> list[str]:
        return [cid for cid, o in self.outcomes.items() if o.terminal is None]

    @property
    def not_exactly_one_terminal(self) -> list[str]:
        return [
            cid for cid in self.outcomes
            if self.terminals.get(cid) != 1 or self.after_terminal.get(cid, 0) != 0
        ]

    @property
    def never_finalized(self) -> list[str]:
        return [cid for cid in self.outcomes if self.finalize.get(cid, 0) < 1]

    @property
    def untouched(self) -> list[str]:
        return [cid for cid in self.outcomes if not self.touched(cid)]

    @property
    def untouched_not_once(self) -> list[str]:
        return [cid for cid in self.untouched if self.finalize.get(cid, 0) != 1]

    @property
    def left_pending(self) -> int:
        return sum(self.pending.values())

    def ok(self) -> bool:
        return not (
            self.lost or self.not_exactly_one_terminal or self.never_finalized
            or self.untouched_not_once or self.left_pending
        )

    def summary(self) -> str:
        results = collections.Counter(
            "ok" if o.error is None and o.terminal is not None
            else f"{o.error['status_code']} {o.error['code']}" if o.error else "lost"
            for o in self.outcomes.values()
        )
        touched = [cid for cid in self.outcomes if self.touched(cid)]
        finals = collections.Counter(self.finalize.get(cid, 0) for cid in self.outcomes)
        replica_kills = sum(k.role == "worker" for k in self.kills)
        orchestrator_kills = sum(k.role == "orchestrator" for k in self.kills)
        c = self.config
        lines = [
            f"chaos run: {len(self.outcomes)} requests, seed {c.seed}, {c.rate:g} req/s, "
            f"2 groups x {c.replicas} replicas, 2 orchestrators",
            f"  duration          {self.duration:.1f} s",
            f"  kills             {replica_kills} worker replicas, {orchestrator_kills} orchestrator(s) (SIGKILL, restarted after {c.restart_after:g} s)",
            f"  results           {dict(sorted(results.items()))}",
            f"  lost              {len(self.lost)}",
            f"  terminal items    exactly one for {len(self.outcomes) - len(self.not_exactly_one_terminal)}/{len(self.outcomes)}",
            f"  finalize runs     {dict(sorted(finals.items()))} (runs per request: number of requests)",
            f"  untouched         {len(self.untouched)} requests, finalize exactly once: {len(self.untouched) - len(self.untouched_not_once)}",
            f"  touched by a kill {len(touched)} requests, finalize at least once: {sum(self.finalize.get(cid, 0) >= 1 for cid in touched)}, "
            f"recovered by another orchestrator: {sum(self.recovered.get(cid, False) for cid in touched)}",
            f"  left pending      {self.left_pending} {self.pending}",
            f"  dead letters      {self.dead_letters}",
            f"  verdict           {'PASS' if self.ok() else 'FAIL'}",
        ]
        return "\n".join(lines)


async def run_chaos(env: dict[str, str], log_dir: Path, config: ChaosConfig | None = None) -> ChaosReport:
    config = config or ChaosConfig()
    rng = random.Random(config.seed)
    procs = Processes(env, log_dir)
    keys = Keys(env["HOOKBUS_PREFIX"])
    prefix = keys.prefix
    client = aredis.Redis.from_url(env["REDIS_URL"], max_connections=500)
    report = ChaosReport(config)
    try:
        workers: dict[str, list[Proc]] = {
            group: [
                procs.worker(
                    group, *skills, replica=f"{group}-{n}", claim_idle=config.worker_claim_idle,
                    concurrency=16,
                )
                for n in range(config.replicas)
            ]
            for group, skills in GROUPS.items()
        }
        orchestrators = [
            procs.orchestrator(
                AGENT, instance=f"orch-{n}", claim_idle=config.orchestrator_claim_idle, concurrency=64,
            )
            for n in range(2)
        ]
        await procs.wait_ready(*(w for ws in workers.values() for w in ws), *orchestrators)

        started = time.monotonic()
        span = config.requests / config.rate
        schedule = sorted(
            [(rng.uniform(0.1, 0.9) * span, "worker") for _ in range(config.replica_kills)]
            + [(rng.uniform(0.3, 0.7) * span, "orchestrator") for _ in range(config.orchestrator_kills)]
        )
        killer = asyncio.create_task(_killer(procs, workers, orchestrators, schedule, started, rng, config, report))
        readers: list[asyncio.Task[Outcome]] = []
        for n in range(config.requests):
            await _sleep_until(started + n / config.rate)
            cid = f"chatcmpl-chaos-{n:05d}-{uuid.uuid4().hex[:6]}"
            words, delay = rng.randint(4, 30), rng.randint(5, 40)
            stream = rng.random() < 0.7
            text = f"[[words:{words}]] [[delay:{delay}]]" if stream else f"[[delay:{delay * 5}]] [[echo]] request {n}"
            report.submitted[cid] = time.monotonic()
            await submit(client, keys, text, completion_id=cid, stream=stream, timeout=config.request_timeout)
            readers.append(asyncio.create_task(read_until_terminal(client, keys, cid, timeout=config.request_timeout)))
        outcomes = await asyncio.gather(*readers)
        report.outcomes = {o.completion_id: o for o in outcomes}
        await killer
        report.duration = time.monotonic() - started

        await _settle(client, keys, config.settle)
        await asyncio.sleep(1.0)  # a fenced-out or late writer would show up now
        for cid, outcome in report.outcomes.items():
            terminals, after = await _terminal_items(client, keys, cid, outcome)
            report.terminals[cid], report.after_terminal[cid] = terminals, after
            report.finalize[cid] = int(await client.get(fault_key("finalize", cid, prefix=prefix)) or 0)
            report.remote_finalize[cid] = int(await client.get(fault_key("wfinalize", cid, prefix=prefix)) or 0)
            report.recovered[cid] = (await client.hget(keys.journal(cid), "recovered")) == b"1"
        report.pending = await _pending(client, keys)
        report.dead_letters = await client.xlen(keys.dead_letter)
        if not report.ok():
            report.logs = procs.logs(lines=80)
        return report
    finally:
        procs.close()
        await client.aclose()


async def _killer(
    procs: Processes,
    workers: dict[str, list[Proc]],
    orchestrators: list[Proc],
    schedule: list[tuple[float, str]],
    started: float,
    rng: random.Random,
    config: ChaosConfig,
    report: ChaosReport,
) -> None:
    restarts: list[asyncio.Task[None]] = []

    async def restart_later(pool: list[Proc], index: int) -> None:
        await asyncio.sleep(config.restart_after)
        pool[index] = procs.restart(pool[index])

    for at, role in schedule:
        await _sleep_until(started + at)
        if role == "worker":
            group = rng.choice(sorted(workers))
            pool = workers[group]
        else:
            pool = orchestrators
        alive = [i for i, p in enumerate(pool) if p.alive]
        if len(alive) < 2:  # keep one of each alive: a group with none only times out
            continue
        index = rng.choice(alive)
        victim = pool[index]
        victim.kill()
        report.kills.append(Kill(time.monotonic(), victim.name, role))
        restarts.append(asyncio.create_task(restart_later(pool, index)))
    await asyncio.gather(*restarts)


async def _sleep_until(moment: float) -> None:
    delay = moment - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def _pending(client: aredis.Redis, keys: Keys) -> dict[str, int]:
    streams = {keys.requests: ORCHESTRATOR_GROUP}
    for group in GROUPS:  # the shared stream, and the one of the version the replicas run
        streams |= {keys.hooks(group): group, await version_stream(client, keys, group): group}
    result = {}
    for stream, group in streams.items():
        try:
            result[stream.removeprefix(keys.prefix)] = int((await client.xpending(stream, group))["pending"])
        except aredis.ResponseError:
            result[stream.removeprefix(keys.prefix)] = 0
    return result


async def _settle(client: aredis.Redis, keys: Keys, timeout: float) -> None:
    """Until nothing is pending (claims of killed replicas' last entries take a moment)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not sum((await _pending(client, keys)).values()):
            return
        await asyncio.sleep(0.25)


async def _terminal_items(client: aredis.Redis, keys: Keys, cid: str, outcome: Outcome) -> tuple[int, int]:
    """(terminal items stored, items stored after the first one)."""
    stored = await stored_items(client, keys, cid)
    terminals = [i for i, item in enumerate(stored) if item is not None and item.kind in TERMINAL_KINDS]
    return len(terminals), (len(stored) - terminals[0] - 1 if terminals else 0)


# ------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rate", type=float, default=8.0, help="requests submitted per second")
    parser.add_argument("--replica-kills", type=int, default=None, help="default: one per 6 s of run")
    parser.add_argument("--orchestrator-kills", type=int, default=1)
    args = parser.parse_args(argv)

    from hookbus.bus.connection.embedded import EmbeddedRedis
    from hookbus.services.testing.offline_server import shared_offline_base_url

    span = args.requests / args.rate
    config = ChaosConfig(
        requests=args.requests, seed=args.seed, rate=args.rate,
        replica_kills=args.replica_kills if args.replica_kills is not None else max(1, int(span / 6)),
        orchestrator_kills=args.orchestrator_kills,
    )
    with tempfile.TemporaryDirectory(prefix="hookbus-chaos-") as tmp, EmbeddedRedis(
        directory=Path(tmp) / "redis", appendonly=True
    ) as server:
        env = dict(os.environ)
        env.update(
            REDIS_URL=server.url,
            HOOKBUS_PREFIX=f"chaos{uuid.uuid4().hex[:6]}:",
            OPENAI_BASE_URL=shared_offline_base_url(),
            HOOKBUS_LOG_FORMAT="json",
            HOOKBUS_LOG_LEVEL="warning",
            PYTHONUNBUFFERED="1",
        )
        print(f"chaos run: {config.requests} requests at {config.rate:g}/s, seed {config.seed}, "
              f"{config.replica_kills} replica kills, {config.orchestrator_kills} orchestrator kill(s)...", flush=True)
        report = asyncio.run(run_chaos(env, Path(tmp) / "logs", config))
        print(report.summary())
        if not report.ok():
            print(report.logs, file=sys.stderr)
    return 0 if report.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
