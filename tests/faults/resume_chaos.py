"""The resumed-run chaos run: requests with tool rounds and streams through two
orchestrators (real `hookbus orchestrator` processes, the paying agent of
tests.faults.fault_skills:resume_agent), each SIGKILLed mid-load and restarted under its
name, as a supervisor would. Three kinds of request, mixed at random (seeded):

- `tools`: not streamed, three tool rounds paying each time, then the answer;
- `tools-stream`: the same streamed (its text comes only in the last round: a kill in any
  tool round catches it before its first text);
- `words`: a stream of text from its first chunk on (a kill catches it after its first text).

The verdicts (`ResumeChaosReport.problems`): every request not streamed, and every stream
that had sent no text when its orchestrator died, completes with the right answer; a
stream ends `orchestrator_lost` only after text reached its client, and never receives a
chunk twice (its text is a prefix of the answer, one role delta); every payment happened
exactly once (counted by the tool, one per round's own key); finalize_connection ran
exactly once per request; one terminal item each; nothing left pending.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio as aredis

from hookbus.bus.keys import ORCHESTRATOR_GROUP, Keys
from tests.faults.fault_skills import RESUME_ROUNDS, fault_key
from tests.faults.helpers import Outcome, read_until_terminal, submit, terminal_count
from tests.integration.processes import Proc, Processes

AGENT = "tests.faults.fault_skills:resume_agent"
ANSWER = f"Final answer after {RESUME_ROUNDS} tool calls."
WORDS = 30
PROMPTS = {
    "tools": ("[[loop:pay]] payhold=0.3 [[delay:80]]", False),
    "tools-stream": ("[[loop:pay]] payhold=0.3 [[delay:40]]", True),
    "words": (f"[[words:{WORDS}]] [[delay:60]]", True),
}
EXPECTED = {"tools": ANSWER, "tools-stream": ANSWER, "words": " ".join(f"w{n}" for n in range(WORDS))}


@dataclass
class ResumeChaosConfig:
    requests: int = 60
    seed: int = 48
    rate: float = 4.0
    """Requests submitted per second."""
    kills_at: tuple[float, ...] = (0.3, 0.65)
    """When each kill happens, as a share of the submitting time; the orchestrators take turns."""
    restart_after: float = 1.5
    claim_idle: float = 1.0
    request_timeout: float = 90.0


@dataclass
class RequestResult:
    kind: str
    outcome: Outcome
    finalized: int = 0
    terminals: int = 0
    payments: list[str] = field(default_factory=list)
    pay_calls: list[str] = field(default_factory=list)
    recovered: bool = False

    @property
    def error_code(self) -> str | None:
        return None if self.outcome.error is None else str(self.outcome.error.get("code"))

    @property
    def text_before_end(self) -> bool:
        return bool(self.outcome.text)



@dataclass
class ResumeChaosReport:
    config: ResumeChaosConfig
    results: dict[str, RequestResult] = field(default_factory=dict)
    kills: list[tuple[float, str]] = field(default_factory=list)
    pending: int = 0
    logs: str = ""

    def problems(self) -> dict[str, str]:
        """What went wrong, by completion id (empty: the run passed)."""
        found: dict[str, str] = {}
        for cid, r in self.results.items():
            expected = EXPECTED[r.kind]
            if r.outcome.terminal is None:
                found[cid] = "no terminal item"
            elif r.error_code is None and r.outcome.text != expected:
                found[cid] = f"wrong answer: {r.outcome.text!r}"
            elif r.error_code is not None and not (
                PROMPTS[r.kind][1] and r.error_code == "orchestrator_lost" and r.text_before_end
            ):
                found[cid] = f"ended {r.error_code} (text before it: {r.text_before_end})"
            elif r.error_code is not None and not expected.startswith(r.outcome.text):
                found[cid] = f"text sent twice or wrong before the error: {r.outcome.text!r}"
            elif PROMPTS[r.kind][1] and role_deltas(r.outcome) != 1:
                found[cid] = f"{role_deltas(r.outcome)} role deltas"
            elif r.finalized != 1:
                found[cid] = f"finalize ran {r.finalized} times"
            elif r.terminals != 1:
                found[cid] = f"{r.terminals} terminal items"
            elif r.kind != "words" and r.error_code is None and not _paid_once_per_round(cid, r.payments):
                found[cid] = f"payments {r.payments}"
            elif len(r.payments) != len(set(r.payments)):
                found[cid] = f"a payment made twice: {r.payments}"
        if self.pending:
            found["(requests)"] = f"{self.pending} entries left pending"
        return found

    def summary(self) -> str:
        c = self.config
        endings = collections.Counter(
            (r.kind, r.error_code or ("ok" if r.outcome.terminal is not None else "lost"))
            for r in self.results.values()
        )
        rerun = sum(len(r.pay_calls) - len(set(r.pay_calls)) for r in self.results.values())
        resumed_ok = sum(r.recovered and r.error_code is None for r in self.results.values())
        lines = [
            f"resume chaos: {len(self.results)} requests, seed {c.seed}, {c.rate:g} req/s, 2 orchestrators",
            f"  kills             {[name for _, name in self.kills]} (SIGKILL, restarted after {c.restart_after:g} s)",
            f"  endings           {dict(sorted(endings.items()))}",
            f"  taken over        {sum(r.recovered for r in self.results.values())} requests, "
            f"{resumed_ok} of them completed",
            f"  tool calls run again with their own key after a takeover: {rerun}",
            f"  payments          {sum(len(r.payments) for r in self.results.values())}",
            f"  problems          {len(self.problems())}",
        ]
        return "\n".join(lines)


def role_deltas(outcome: Outcome) -> int:
    """Chunks carrying the role (a turn has one)."""
    return sum(
        bool((choice.get("delta") or {}).get("role"))
        for item in outcome.items if item.kind == "chunk" and item.chunk
        for choice in item.chunk.get("choices", [])
    )


def _paid_once_per_round(cid: str, paid: list[str]) -> bool:
    return len(paid) == RESUME_ROUNDS and all(
        key.startswith(f"{cid}:tool#{tool_round}:") for tool_round, key in enumerate(paid)
    )


async def run_resume_chaos(env: dict[str, str], log_dir: Path, config: ResumeChaosConfig) -> ResumeChaosReport:
    rng = random.Random(config.seed)
    procs = Processes(env, log_dir)
    keys = Keys(env["HOOKBUS_PREFIX"])
    client = aredis.Redis.from_url(env["REDIS_URL"], max_connections=200)
    report = ResumeChaosReport(config)
    try:
        orchestrators = [
            procs.orchestrator(AGENT, instance=f"orch-{n}", claim_idle=config.claim_idle, concurrency=32)
            for n in range(2)
        ]
        await procs.wait_ready(*orchestrators)
        started = time.monotonic()
        span = config.requests / config.rate
        killer = asyncio.create_task(_killer(procs, orchestrators, [at * span for at in config.kills_at], started, config, report))
        kinds: dict[str, str] = {}
        readers = []
        for n in range(config.requests):
            await _sleep_until(started + n / config.rate)
            kind = rng.choice(sorted(PROMPTS))
            prompt, stream = PROMPTS[kind]
            cid = f"chatcmpl-rchaos-{n:04d}-{uuid.uuid4().hex[:6]}"
            kinds[cid] = kind
            await submit(client, keys, prompt, completion_id=cid, stream=stream, timeout=config.request_timeout)
            readers.append(asyncio.create_task(read_until_terminal(client, keys, cid, timeout=config.request_timeout)))
        outcomes = await asyncio.gather(*readers)
        await killer
        for outcome in outcomes:
            cid = outcome.completion_id
            report.results[cid] = await _result(client, keys, kinds[cid], outcome)
        report.pending = int((await client.xpending(keys.requests, ORCHESTRATOR_GROUP))["pending"])
        if report.problems():
            report.logs = procs.logs(lines=60)
        return report
    finally:
        procs.close()
        await client.aclose()


async def _result(client: aredis.Redis, keys: Keys, kind: str, outcome: Outcome) -> RequestResult:
    cid, prefix = outcome.completion_id, keys.prefix
    calls = await client.lrange(fault_key("pay-calls", cid, prefix=prefix), 0, -1)
    return RequestResult(
        kind, outcome,
        finalized=int(await client.get(fault_key("finalize", cid, prefix=prefix)) or 0),
        terminals=await terminal_count(client, keys, cid),
        payments=[p.decode() for p in await client.lrange(fault_key("pay-effects", cid, prefix=prefix), 0, -1)],
        pay_calls=[json.loads(c)["key"] for c in calls],
        recovered=(await client.hget(keys.journal(cid), "recovered")) == b"1",
    )


async def _killer(
    procs: Processes, orchestrators: list[Proc], moments: list[float], started: float,
    config: ResumeChaosConfig, report: ResumeChaosReport,
) -> None:
    for turn, at in enumerate(moments):
        await _sleep_until(started + at)
        index = turn % len(orchestrators)
        victim = orchestrators[index]
        victim.kill()
        report.kills.append((time.monotonic() - started, victim.name))
        await asyncio.sleep(config.restart_after)
        orchestrators[index] = procs.restart(victim)
        await procs.wait_ready(orchestrators[index])


async def _sleep_until(moment: float) -> None:
    delay = moment - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
