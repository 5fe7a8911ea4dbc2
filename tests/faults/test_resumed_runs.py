"""Runs that go on after their orchestrator died (SIGKILL): a sibling claims the request
and continues it from the steps its journal records (hookbus.bus.store.run_steps). Real
`hookbus orchestrator` processes; the agent pays in a tool (tests.faults.fault_skills:
Payments), which logs each call and makes one payment per idempotency key."""

from __future__ import annotations

import collections
import json
import uuid
from typing import Any

import pytest

from hookbus.bus.keys import Keys
from hookbus.bus.store.journal import Journal
from hookbus.bus.store.run_steps import STEP_FIELD
from tests.faults.fault_skills import RESUME_ROUNDS, fault_key
from tests.faults.helpers import (
    finalize_log,
    read_until_terminal,
    runs,
    submit,
    taken_over,
    terminal_count,
    two_orchestrators,
)
from tests.faults.resume_chaos import (
    AGENT,
    ANSWER,
    ResumeChaosConfig,
    role_deltas,
    run_resume_chaos,
)
from tests.waiting import wait_for

SLOW = "tests.faults.fault_skills:Slow"
LEDGER = "tests.faults.fault_skills:Ledger"

pytestmark = pytest.mark.slow


def new_id(tag: str) -> str:
    return f"chatcmpl-{tag}-{uuid.uuid4().hex[:8]}"


async def pay_calls(redis, prefix: str, cid: str) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    return [json.loads(c) for c in await redis.lrange(fault_key("pay-calls", cid, prefix=prefix), 0, -1)]


async def payments(redis, prefix: str, cid: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [p.decode() for p in await redis.lrange(fault_key("pay-effects", cid, prefix=prefix), 0, -1)]


async def calls_started(redis, prefix: str, cid: str, count: int) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    async def enough() -> list[dict[str, Any]]:
        calls = await pay_calls(redis, prefix, cid)
        return calls if len(calls) >= count else []

    return await wait_for(enough, timeout=30)


def assert_paid_once_per_round(cid: str, paid: list[str]) -> None:
    """One payment per tool round, each under the call's own key (completion id, round, call id)."""
    assert len(paid) == RESUME_ROUNDS == len(set(paid)), paid
    for tool_round, key in enumerate(paid):
        assert key.startswith(f"{cid}:tool#{tool_round}:call_"), paid


async def test_a_request_killed_in_a_tool_call_goes_on_on_a_sibling(procs, redis, keys, prefix):
    hooks = procs.worker("hooks", SLOW, LEDGER, replica="hooks-1", claim_idle=1)
    one, two = await two_orchestrators(procs, AGENT, hooks)

    cid = new_id("resume-tool")
    await submit(redis, keys, "[[loop:pay]] payhold=2", completion_id=cid, stream=False)
    assert len(await calls_started(redis, prefix, cid, 2)) == 2, procs.logs()  # round 1's call runs
    journal = await Journal(redis, Keys(prefix)).read(cid)
    victim, survivor = (one, two) if journal["owner"] == "orch-1" else (two, one)
    victim.kill()

    outcome = await read_until_terminal(redis, keys, cid, timeout=45)
    assert outcome.terminal is not None and outcome.terminal.kind == "final", (outcome.items, procs.logs())
    assert outcome.text == ANSWER
    paid = await payments(redis, prefix, cid)
    assert_paid_once_per_round(cid, paid)
    calls = await pay_calls(redis, prefix, cid)
    # round 0's call finished: not run again; round 1's had started: run again, same key
    assert collections.Counter(c["key"] for c in calls) == {paid[0]: 1, paid[1]: 2, paid[2]: 1}, calls
    assert [c["by"] for c in calls] == [victim.name, victim.name, survivor.name, survivor.name]
    # finalize ran once, in the survivor, which knew it took the run over, in-process and remote
    assert await finalize_log(redis, prefix, cid) == [
        {"by": survivor.name, "recovery": True, "error": None, "code": None}
    ]
    assert await finalize_log(redis, prefix, cid, "wfinalize") == [
        {"by": "hooks-1", "recovery": True, "error": None, "code": None}
    ]
    # the stage the victim ran is not run again: one on_connection, its own
    assert [r["by"] for r in await runs(redis, prefix, cid)] == ["hooks-1"]
    after = await taken_over(redis, keys, cid, survivor.name, victim.name)
    steps = {name: value for name, value in after.items() if name.startswith(STEP_FIELD)}
    assert len(steps) >= 10 and set(steps.values()) == {""}, steps  # blanked with the terminal item


async def test_a_stream_killed_before_its_first_text_goes_on_unnoticed(procs, redis, keys, prefix):
    one, two = await two_orchestrators(procs, AGENT)

    cid = new_id("resume-stream")
    await submit(redis, keys, "[[loop:pay]] payhold=2", completion_id=cid, stream=True)
    assert await calls_started(redis, prefix, cid, 1), procs.logs()
    journal = await Journal(redis, Keys(prefix)).read(cid)
    victim = one if journal["owner"] == "orch-1" else two
    victim.kill()

    outcome = await read_until_terminal(redis, keys, cid, timeout=45)
    assert outcome.terminal is not None and outcome.terminal.kind == "done", (outcome.items, procs.logs())
    assert outcome.text == ANSWER  # every chunk of the answer once
    assert role_deltas(outcome) == 1
    finishes = [
        choice["finish_reason"] for item in outcome.items if item.kind == "chunk" and item.chunk
        for choice in item.chunk.get("choices", []) if choice.get("finish_reason")
    ]
    assert finishes == ["stop"]
    assert_paid_once_per_round(cid, await payments(redis, prefix, cid))
    assert [r["recovery"] for r in await finalize_log(redis, prefix, cid)] == [True]
    assert await terminal_count(redis, keys, cid) == 1


async def test_a_stream_with_no_hook_killed_in_its_llm_call_starts_over_unnoticed(procs, redis, keys, prefix):
    """With no hook at any stage, nothing is on record before the LLM call (its stages
    are free to run again): the sibling that takes the request over runs it from the
    start, and its client gets the whole answer once, finalized once."""
    one, two = await two_orchestrators(procs, "tests.faults.fault_skills:plain_agent")

    cid = new_id("resume-plain")
    await submit(redis, keys, "[[words:5]] [[delay:1500]]", completion_id=cid, stream=True)
    journal = Journal(redis, Keys(prefix))

    async def begun() -> dict[str, str]:
        return await journal.read(cid)

    owner = (await wait_for(begun, timeout=30))["owner"]
    assert not [name for name in await journal.read(cid) if name.startswith(STEP_FIELD)]
    victim = one if owner == "orch-1" else two
    victim.kill()

    outcome = await read_until_terminal(redis, keys, cid, timeout=45)
    assert outcome.terminal is not None and outcome.terminal.kind == "done", (outcome.items, procs.logs())
    assert outcome.text == "w0 w1 w2 w3 w4"
    assert role_deltas(outcome) == 1
    assert await terminal_count(redis, keys, cid) == 1
    assert (await journal.read(cid))["owner"] != victim.name


@pytest.mark.timeout(240)
async def test_chaos_kills_fail_no_request_that_can_go_on(service_env, tmp_path):
    env = dict(service_env, HOOKBUS_LOG_LEVEL="warning")
    report = await run_resume_chaos(env, tmp_path / "logs", ResumeChaosConfig())
    print(report.summary())
    assert not report.problems(), (report.problems(), report.summary(), report.logs)
    assert len(report.kills) == 2
    # the kills caught requests in flight, and those went on on a sibling
    assert sum(r.recovered and r.error_code is None for r in report.results.values()) >= 2, report.summary()
