"""The steps run against the live compose stack, each returning what it showed.

Every expectation is checked on what a user or operator sees: the openai client's answers,
`hookbus status`, the events firehose and the finalize log lines.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

from tests.deploy.check import evidence
from tests.deploy.check.commands import CheckFailed, docker_cli, run
from tests.deploy.check.stack import Stack
from tests.deploy.check.traffic import Outcome, ask, client, load, served_models

# Each model chunk waits 150 ms, so a request is in flight for about two seconds.
SLOW = "[[delay:150]] [[words:12]] a slow answer"
FINALIZE_TIMEOUT = 90.0
RECOVERY_TIMEOUT = 120.0
SERVICES = {
    "redis": 1, "model": 1, "orchestrator": 2, "orchestrator-support": 2, "worker-guard": 1, "worker-telemetry": 1,
    "worker-billing": 1, "gateway": 1,
}


def expect(condition: object, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def count_containers(stack: Stack) -> str:
    counts = {service: len(stack.containers(service)) for service in SERVICES}
    expect(counts == SERVICES, f"containers per service: {counts}, expected {SERVICES}")
    return ", ".join(f"{service} {n}" for service, n in counts.items())


def compose_up(stack: Stack) -> str:
    """Up, healthy, the expected containers, and the gateway's model list behind an API key."""
    stack.up()
    healthy = stack.wait_healthy()
    containers = count_containers(stack)
    models = asyncio.run(served_models(stack.base_url, stack.caller(has_credit=True).key))
    expect({"demo", "support"} <= set(models), f"GET /v1/models lists {models}, not the agents demo and support")
    stack.model = "demo"  # the agent whose orchestrators and worker groups the faults below hit
    return f"healthy in {healthy} s: {containers}; model {stack.model!r}"


def requests(stack: Stack) -> str:
    """Streamed and not, a tool call, a 402 from the billing group, a 401 for a wrong key."""

    async def scenario() -> list[Outcome]:
        async with (
            stack.api(has_credit=True) as alice,
            stack.api(has_credit=False) as bob,
            client(stack.base_url, "sk-not-a-key", stack.model) as stranger,
        ):
            return [
                await ask(alice, "hello from the deploy check", stream=False),
                await ask(alice, "[[words:20]] stream please", stream=True),
                await ask(alice, 'what is 2 + 3? [[tool:add {"a": 2, "b": 3}]]', stream=False),
                await ask(bob, "bob has no credit", stream=True),
                await ask(stranger, "who am I?", stream=False),
            ]

    plain, streamed, tool, refused, unknown = asyncio.run(scenario())
    expect(plain.terminal == "completed" and "hello from the deploy check" in plain.content, f"plain: {plain}")
    expect(streamed.terminal == "completed" and len(streamed.content.split()) == 20, f"streamed: {streamed}")
    expect(tool.terminal == "completed" and "add returned: 5" in tool.content, f"tool call: {tool}")
    expect(refused.status_code == 402 and refused.error_code == "payment_required", f"402: {refused}")
    expect(unknown.status_code == 401, f"wrong key: {unknown}")
    sessions = [plain, streamed, tool, refused]
    finalized = wait_finalized(stack, sessions)
    expect(finalized[refused.session_id].outcome == "402 payment_required", f"finalize of the 402: {finalized[refused.session_id]}")
    return (
        f"200 plain {plain.seconds} s, 200 streamed {streamed.seconds} s, tool call -> {tool.content!r}, "
        f"402 {refused.error_code}, 401 for an unknown key; finalize logged for all 4"
    )


def wait_finalized(stack: Stack, outcomes: list[Outcome]) -> dict[str, evidence.Finalized]:
    """The finalize log line of each of these requests; fails naming the ones that never got
    one, or got more than one (finalize_connection runs exactly once)."""
    wanted = {o.session_id for o in outcomes}
    deadline = time.monotonic() + FINALIZE_TIMEOUT
    while True:
        found = evidence.finalized_sessions(stack)
        missing = wanted - set(found)
        if not missing:
            break
        if time.monotonic() > deadline:
            raise CheckFailed(f"no finalize for {len(missing)} of {len(wanted)} requests: {sorted(missing)[:5]}")
        time.sleep(2)  # poll interval of this condition wait (each poll reads every container's log)
    twice = {session: len(found[session]) for session in wanted if len(found[session]) > 1}
    expect(not twice, f"finalize ran more than once for {len(twice)} of {len(wanted)} requests: {twice}")
    return {session: found[session][0] for session in wanted}


async def paying_load(stack: Stack, count: int, text: str, *, tag: str, parallel: int = 8) -> list[Outcome]:
    """`count` requests by the caller with credit."""
    async with stack.api(has_credit=True) as api:
        return await load(api, count, text, tag=tag, parallel=parallel)


async def paying_request(stack: Stack, text: str, *, tag: str) -> Outcome:
    async with stack.api(has_credit=True) as api:
        return await ask(api, text, stream=False, tag=tag)


def outcome_summary(outcomes: list[Outcome]) -> str:
    kinds = Counter(o.terminal if o.terminal != "error" else f"error {o.status_code or o.error_code}" for o in outcomes)
    slowest = max(o.seconds for o in outcomes)
    return f"{', '.join(f'{n} {kind}' for kind, n in kinds.items())}, slowest {slowest} s"


def all_terminal(stack: Stack, outcomes: list[Outcome]) -> str:
    """Every request got a terminal answer and its finalize ran."""
    open_ended = [o for o in outcomes if o.terminal not in ("completed", "error")]
    expect(not open_ended, f"{len(open_ended)} requests without a terminal answer: {open_ended[:3]}")
    wait_finalized(stack, outcomes)
    return f"{outcome_summary(outcomes)}; finalize logged once for each of {len(outcomes)}"


def scale_guard(stack: Stack) -> str:
    """Three guard replicas; the two new ones run hops."""
    before = set(stack.containers("worker-guard"))
    stack.up("worker-guard=3", "orchestrator=2")
    new = [c for c in stack.containers("worker-guard") if c not in before]
    expect(len(new) == 2, f"scaling added {len(new)} guard containers, expected 2")
    stack.wait_healthy()
    status = stack.status()
    guard = next(g for g in status.groups if g.name == "guard")
    expect(len(guard.replicas) == 3, f"hookbus status shows guard replicas {guard.replicas}")
    since = time.time()
    outcomes = asyncio.run(paying_load(stack, 24, "[[words:30]] share the work", tag="scale"))
    expect(all(o.terminal == "completed" for o in outcomes), f"load after scaling: {outcome_summary(outcomes)}")
    hops = evidence.hops_by_replica(stack, "guard", since)
    # A replica's name holds its host name, which is the container's short id.
    new_hops = {c[:12]: sum(n for replica, n in hops.items() if c[:12] in replica) for c in new}
    expect(all(new_hops.values()), f"new replicas without hops: {new_hops}; all: {dict(hops)}")
    return (
        f"hookbus status: guard has {len(guard.replicas)} replicas; of 24 requests' guard hops "
        f"the 2 new replicas ran {sorted(new_hops.values(), reverse=True)}, all 3 {sorted(hops.values(), reverse=True)}"
    )


def kill_mid_load(stack: Stack) -> str:
    """docker kill a guard replica and an orchestrator while 24 slow requests run."""

    async def scenario() -> list[Outcome]:
        running = asyncio.create_task(paying_load(stack, 24, SLOW, tag="kill", parallel=12))
        await asyncio.sleep(1.5)  # the kill lands mid-load: the first 12 requests take ~1.8 s each
        victims = [stack.containers("worker-guard")[0], stack.containers("orchestrator")[0]]
        await asyncio.to_thread(run, [docker_cli(), "kill", *victims])
        return await running

    outcomes = asyncio.run(scenario())
    # a request the dead orchestrator ran goes on on the other one; only a stream whose
    # client already had text ends orchestrator_lost (docs/operations.md)
    lost = [o for o in outcomes if o.error_code == "orchestrator_lost"]
    early = [o for o in lost if not (o.stream and o.content)]
    expect(not early, f"{len(early)} requests ended orchestrator_lost before any text reached them: {early[:3]}")
    summary = all_terminal(stack, outcomes)
    return (
        f"killed a guard worker and an orchestrator: {summary}; orchestrator_lost only after text: "
        f"{len(lost)}, before any text: 0"
    )


def drain_on_stop(stack: Stack) -> str:
    """docker stop a guard replica mid-load: it drains and exits on SIGTERM, nothing fails."""

    async def scenario() -> tuple[list[Outcome], float]:
        running = asyncio.create_task(paying_load(stack, 12, SLOW, tag="stop", parallel=12))
        await asyncio.sleep(1.0)  # the stop lands mid-load: the 12 requests take ~1.8 s each
        started = time.monotonic()
        await asyncio.to_thread(run, [docker_cli(), "stop", "--time", "45", victim])
        return await running, time.monotonic() - started

    victim = stack.containers("worker-guard")[-1]
    outcomes, stop_seconds = asyncio.run(scenario())
    state = stack.inspect(victim)["State"]
    expect(state["ExitCode"] != 137 and not state["OOMKilled"], f"stopped replica exit code {state['ExitCode']} (137 = killed after the grace period)")
    expect(stop_seconds < 40, f"docker stop took {stop_seconds:.1f} s")
    expect(all(o.terminal == "completed" for o in outcomes), f"during the stop: {outcome_summary(outcomes)}")
    wait_finalized(stack, outcomes)
    run([docker_cli(), "start", victim])
    return f"stopped in {stop_seconds:.1f} s with exit code {state['ExitCode']}; {outcome_summary(outcomes)}"


def restart_redis(stack: Stack) -> str:
    """docker restart Redis while 12 slow requests run: each ends with a terminal answer and
    one finalize; the stack answers again by itself and kept its state (AOF)."""
    groups_before = {g.name for g in stack.status().groups}

    async def scenario() -> tuple[list[Outcome], float]:
        running = asyncio.create_task(paying_load(stack, 12, SLOW, tag="redis-across", parallel=12))
        await asyncio.sleep(1.0)  # the restart lands mid-load: the 12 requests take ~1.8 s each
        began = time.monotonic()
        await asyncio.to_thread(run, [docker_cli(), "restart", "--time", "10", stack.containers("redis")[0]])
        return await running, began

    across, began = asyncio.run(scenario())
    spanned = sum(o.ended > began for o in across)
    expect(spanned, f"every request had ended before the restart began: {outcome_summary(across)}")
    restarted = time.monotonic()
    while True:
        first = asyncio.run(paying_request(stack, "are you back?", tag="redis"))
        if first.terminal == "completed":
            break
        if time.monotonic() - restarted > RECOVERY_TIMEOUT:
            raise CheckFailed(f"no answer {RECOVERY_TIMEOUT:.0f} s after the Redis restart: {first}")
        time.sleep(1)  # poll interval of this condition wait (the recovery time is what it measures)
    recovered = time.monotonic() - restarted
    outcomes = asyncio.run(paying_load(stack, 12, "[[words:10]] after the restart", tag="redis"))
    expect(all(o.terminal == "completed" for o in outcomes), f"after the restart: {outcome_summary(outcomes)}")
    wait_finalized(stack, [first, *outcomes])
    groups_after = {g.name for g in stack.status().groups}
    expect(groups_before <= groups_after, f"groups before {groups_before}, after {groups_after}")
    healthy = stack.wait_healthy()
    return (
        f"{spanned} of 12 in flight when it began: {all_terminal(stack, across)}; first answer {recovered:.1f} s after the restart; "
        f"12 of 12 after it, finalize once each; groups kept: {sorted(groups_after)}; all healthy {healthy} s later"
    )


def json_logs(stack: Stack) -> str:
    """Every line every hookbus container logged, through all the faults above, is JSON."""
    counted, bad = 0, []
    for service in SERVICES:
        if service == "redis":
            continue
        for line in stack.logs(service):
            if not line.strip():
                continue
            counted += 1
            try:
                json.loads(line)
            except ValueError:
                bad.append(f"{service}: {line[:120]}")
    expect(not bad, f"{len(bad)} of {counted} log lines are not JSON, e.g. {bad[:3]}")
    return f"{counted} lines from the hookbus containers, all JSON"


def teardown(stack: Stack) -> str:
    stack.down()
    left = stack.containers(running=False)
    expect(not left, f"containers left: {left}")
    return "compose down --volumes: no container, network or volume left"
