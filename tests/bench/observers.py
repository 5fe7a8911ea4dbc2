"""Bench: what a worker group of observers adds to a request's latency (issue 30).

Two stacks run side by side on the same Redis (each: orchestrator + gateway, the cost
bench's agent and request, the offline model in this process): one has no hooks at all,
the other one worker group whose hooks are all observers, one on every lifecycle
(tests.bench.skills.WatchOnly, on_chunk included; the request compacts nothing, so its
on_compaction observer has nothing to see). Streamed requests through the gateway
with the `openai` client, one at a time, alternating between the stacks so both see the
same machine; p50 and p90 of the whole request (until the stream's end) per stack. Every
measured request of the observed stack is checked to have been observed by every hook.

Then what declaring the watching hooks observers saves (issues 30 and 45), on two mixes,
each run three ways side by side in the same windows (tests.bench.cost.run_costs: a
Redis each, the stacks' requests alternating, 100 sequential then rounds at c=8):
undeclared, declared, and with the watching hooks removed (the floor no way of running
them gets below). The mixes: the docs' (cost bench) mix, `policy` on all nine points and
`audit` on three, six of the twelve watching; and the split mix, nine hooks one per point
split over two groups that both check and watch (tests.bench.skills.SPLIT), five of the
nine watching. Printed per mix: Redis commands, Python CPU and Redis CPU per request,
declared and floor against undeclared, at c=1 and c=8, and the commands by name. Every
observer is checked to have been called for every measured request.

Run alone: `python -m tests.bench.observers`.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, replace

from hookbus.services.worker.observer import LINGER
from tests.bench.common import Row, new_prefix, processes, quiet_logs, run_alone, scaled
from tests.bench.cost import (
    COST_REQUEST,
    PARALLEL,
    PLAIN_REQUEST,
    UNDECLARED,
    CostResult,
    Loaded,
    Request,
    observed_by,
    one_request,
    run_costs,
    start_stack,
)
from tests.bench.skills import SPLIT, WATCHING

REQUESTS = 60
WATCH = {"watch": ["tests.bench.skills:WatchOnly"]}


async def measure(redis_url: str) -> list[Row]:
    return await measure_latency(redis_url) + await measure_mixes(redis_url)


async def measure_latency(redis_url: str) -> list[Row]:
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


@dataclass(frozen=True)
class Mix:
    """A mix of worker groups three ways: as is, its watching hooks declared observers,
    and without them; the observer keys the declared one must call for every request; the
    request it is measured with."""

    name: str
    undeclared: dict[str, list[str]]
    declared: dict[str, list[str]]
    checks: dict[str, list[str]]
    observers: frozenset[str]
    request: Request = COST_REQUEST


def _skills(names: dict[str, str]) -> dict[str, list[str]]:
    return {group: [f"tests.bench.skills:{name}"] for group, name in names.items()}


DOCS_MIX = Mix(
    "docs' mix", UNDECLARED,
    _skills({"policy": "CostPolicyObserved", "audit": "CostAuditObserved"}),
    _skills({"policy": "CostPolicyChecks", "audit": "CostAuditChecks"}),
    frozenset({f"cost-policy.p_{lc}" for lc in WATCHING} | {"cost-audit.a_finalize_connection"}),
)
ISSUE_MIX = Mix(
    "the split mix",
    _skills({group: f"Split{group.title()}Undeclared" for group in SPLIT}),
    _skills({group: f"Split{group.title()}Declared" for group in SPLIT}),
    _skills({group: f"Split{group.title()}Checks" for group in SPLIT}),
    frozenset(f"{name}.{group[0]}_{lc}" for group, (name, lcs) in SPLIT.items() for lc in lcs if lc in WATCHING),
)
PLAIN_MIX = replace(
    ISSUE_MIX, name="the split mix, plain request",
    # no tool call: the tool hooks see nothing, finalize_connection is meter's one observer left
    observers=frozenset(key for key in ISSUE_MIX.observers if "toolcall" not in key),
    request=PLAIN_REQUEST,
)
"""The same nine hooks under a streamed answer with no tool call, where the request's own
commands weigh more beside its hooks' (the request of the peer benches)."""
MIXES = (DOCS_MIX, ISSUE_MIX, PLAIN_MIX)


async def measure_mixes(redis_url: str) -> list[Row]:
    """The mixes of one request in one run (their stacks' requests alternating), each
    request's in a run of its own."""
    quiet_logs()
    rows: list[Row] = []
    for request in dict.fromkeys(mix.request for mix in MIXES):
        mixes = [mix for mix in MIXES if mix.request == request]
        stacks = [groups for mix in mixes for groups in (mix.undeclared, mix.declared, mix.checks)]
        results = await run_costs(redis_url, stacks, request)
        for n, mix in enumerate(mixes):
            undeclared, declared, checks = results[3 * n: 3 * n + 3]
            rows += report_mix(mix, undeclared, declared, checks)
    return rows


def report_mix(mix: Mix, undeclared: CostResult, declared: CostResult, checks: CostResult) -> list[Row]:
    """The mix declared and without its watching hooks (the floor), against it undeclared."""
    missing = mix.observers - declared.observers
    if missing:
        raise RuntimeError(f"{mix.name}: observers not called for every request: {sorted(missing)}")
    before, after, floor = undeclared.cost, declared.cost, checks.cost
    print(f"\n[observers] {mix.name}: {len(mix.observers)} observers, each called for every one of "
          f"{declared.requests} requests; declared | floor (watching hooks removed) | undeclared, ratios to undeclared")

    def line(label: str, values: tuple[float, float, float], unit: str = "") -> None:
        d, f, u = values
        print(f"  {label:<28} {d:7.2f}{unit} ({d / u:.2f}x) | {f:7.2f}{unit} ({f / u:.2f}x) | {u:7.2f}{unit}")

    line("Redis commands, c=1", (after.total_commands, floor.total_commands, before.total_commands))
    line("Python CPU, c=1", (after.python_cpu_ms, floor.python_cpu_ms, before.python_cpu_ms), " ms")
    line("Redis CPU, c=1", (after.redis_cpu_ms, floor.redis_cpu_ms, before.redis_cpu_ms), " ms")
    line("hops", tuple(sum(r.hops.values()) / r.requests for r in (declared, checks, undeclared)))  # type: ignore[arg-type]
    d, f, u = (_loaded(r) for r in (declared, checks, undeclared))
    line(f"Redis commands, c={PARALLEL}", (d.commands, f.commands, u.commands))
    line(f"Python CPU, c={PARALLEL}", (d.python_cpu_ms, f.python_cpu_ms, u.python_cpu_ms), " ms")
    line(f"requests/s, c={PARALLEL}", (d.rate, f.rate, u.rate))
    _by_command("c=1", after.commands, floor.commands, before.commands)
    _by_command(f"c={PARALLEL}", d.by_command, f.by_command, u.by_command)
    name = "watching hooks undeclared"
    rows = [
        Row("observers", f"{mix.name}: Redis CPU per streamed request, c=1", after.redis_cpu_ms, "ms",
            before.redis_cpu_ms, name),
    ]
    for at, commands, cpu in (
        ("c=1", (after.total_commands, floor.total_commands, before.total_commands),
         (after.python_cpu_ms, before.python_cpu_ms)),
        (f"c={PARALLEL}", (d.commands, f.commands, u.commands), (d.python_cpu_ms, u.python_cpu_ms)),
    ):
        rows += [
            Row("observers", f"{mix.name}: Redis commands per streamed request, {at}", commands[0], "",
                commands[2], name, target="<=0.6x"),
            Row("observers", f"{mix.name}: watching hooks removed, Redis commands, {at}", commands[1], "",
                commands[2], name, note="the floor of any observer design"),
            Row("observers", f"{mix.name}: Python CPU per streamed request, {at}", cpu[0], "ms", cpu[1], name),
        ]
    return rows


def _by_command(at: str, declared: dict[str, float], floor: dict[str, float], undeclared: dict[str, float]) -> None:
    names = sorted(set(declared) | set(undeclared), key=lambda c: -undeclared.get(c, 0.0))
    print(f"  by command at {at} (declared / floor / undeclared): " + ", ".join(
        f"{c} {declared.get(c, 0.0):.1f}/{floor.get(c, 0.0):.1f}/{undeclared.get(c, 0.0):.1f}" for c in names))


def _loaded(result: CostResult) -> Loaded:
    assert result.loaded is not None, "run_costs measures every stack at c=PARALLEL"
    return result.loaded


if __name__ == "__main__":
    run_alone(measure, "observers")
