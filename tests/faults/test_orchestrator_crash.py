"""Orchestrators that die (SIGKILL), stall (SIGSTOP) or run long: real `hookbus
orchestrator` processes, a worker group hosting a finalize counter."""

from __future__ import annotations

import uuid

import pytest

from hookbus.bus.keys import ORCHESTRATOR_GROUP, Keys
from hookbus.bus.store.journal import Journal
from hookbus.bus.store.run_steps import stream_sent
from hookbus.skills import HookError, OrchestratorLost
from tests.faults.helpers import (
    finalize_log,
    items_after_terminal,
    pending,
    read_until_terminal,
    submit,
    taken_over,
    terminal_count,
)
from tests.waiting import wait_for

LEDGER = "tests.faults.fault_skills:Ledger"
AGENT = "tests.faults.fault_skills:agent"
STREAMING = "[[words:40]] [[delay:100]]"  # about 4 s of streaming

pytestmark = pytest.mark.slow


def new_id(tag: str) -> str:
    return f"chatcmpl-{tag}-{uuid.uuid4().hex[:8]}"


async def started(redis, prefix, cid, chunks: int = 1) -> dict[str, str]:
    """The journal once its run wrote at least `chunks` response items."""
    journal = Journal(redis, Keys(prefix))

    async def ready():
        return await journal.read(cid) if await journal.written(cid) >= chunks else None

    return await wait_for(ready, timeout=15)


async def test_a_killed_orchestrators_request_is_finalized_by_another(procs, redis, keys, prefix):
    ledger = procs.worker("ledger", LEDGER, replica="ledger-1", claim_idle=1)
    one = procs.orchestrator(AGENT, instance="orch-1", claim_idle=1)
    two = procs.orchestrator(AGENT, instance="orch-2", claim_idle=1)
    await procs.wait_ready(ledger, one, two)

    cid = new_id("kill-orch")
    await submit(redis, keys, STREAMING, completion_id=cid, session_id=f"s-{cid}")
    journal = await started(redis, prefix, cid, chunks=3)
    assert journal, procs.logs()
    victim, survivor = (one, two) if journal["owner"] == "orch-1" else (two, one)
    victim.kill()

    outcome = await read_until_terminal(redis, keys, cid, timeout=30)
    assert outcome.terminal is not None, procs.logs()
    assert outcome.error is not None and outcome.error["status_code"] == 503, outcome.terminal
    assert outcome.error["code"] == "orchestrator_lost"
    assert type(HookError.from_dict(outcome.error)) is OrchestratorLost  # what a client raises
    assert sum(i.kind == "chunk" for i in outcome.items) >= 3  # what the client saw before the crash
    # finalize ran once, in the survivor, flagged as a recovery, in-process and remote
    local = await finalize_log(redis, prefix, cid)
    remote = await finalize_log(redis, prefix, cid, "wfinalize")
    assert local == [{"by": survivor.name, "recovery": True, "error": 503, "code": "orchestrator_lost"}]
    assert remote == [{"by": "ledger-1", "recovery": True, "error": 503, "code": "orchestrator_lost"}]
    await taken_over(redis, keys, cid, survivor.name, victim.name)


async def test_a_long_llm_call_keeps_its_lease(procs, redis, keys, prefix):
    one = procs.orchestrator(AGENT, instance="orch-1", claim_idle=1)
    two = procs.orchestrator(AGENT, instance="orch-2", claim_idle=1)
    await procs.wait_ready(one, two)

    cid = new_id("long-llm")
    await submit(redis, keys, "[[delay:3500]] [[echo]] worth the wait", completion_id=cid, stream=False)
    outcome = await read_until_terminal(redis, keys, cid, timeout=30)
    assert outcome.terminal is not None and outcome.terminal.kind == "final", outcome.items
    assert outcome.text == "worth the wait"
    assert [r["recovery"] for r in await finalize_log(redis, prefix, cid)] == [False]
    journal = await Journal(redis, Keys(prefix)).read(cid)
    assert journal["epoch"] == "1" and "recovered" not in journal


async def test_a_stalled_owner_that_lost_its_request_writes_nothing_after(procs, redis, keys, prefix):
    one = procs.orchestrator(AGENT, instance="orch-1", claim_idle=1)
    two = procs.orchestrator(AGENT, instance="orch-2", claim_idle=1)
    await procs.wait_ready(one, two)

    cid = new_id("stall")
    await submit(redis, keys, STREAMING, completion_id=cid)
    journal = await started(redis, prefix, cid, chunks=3)
    assert journal, procs.logs()
    stalled, other = (one, two) if journal["owner"] == "orch-1" else (two, one)
    stalled.pause()  # SIGSTOP: alive, but silent (no heartbeat, no lease renewal)
    try:
        outcome = await read_until_terminal(redis, keys, cid, timeout=30)
    finally:
        stalled.resume()
    assert outcome.error is not None and outcome.error["code"] == "orchestrator_lost", procs.logs()

    async def old_owner_gave_up() -> bool:  # it ran on after SIGCONT and found it had lost the request
        return any("request_fenced_out" in line and cid in line for line in stalled.log_tail(400).splitlines())

    assert await wait_for(old_owner_gave_up, timeout=15), stalled.log_tail(50)
    assert await items_after_terminal(redis, keys, outcome) == []
    assert await terminal_count(redis, keys, cid) == 1
    after = await Journal(redis, Keys(prefix)).read(cid)
    assert after["owner"] == other.name and after["epoch"] == "2" and after["done"] == "1"
    logs = await finalize_log(redis, prefix, cid)
    # finalize ran once, by the new owner: the old one checked its fence right before
    # finalize_connection when it woke, and found it had lost the request
    assert logs == [{"by": other.name, "recovery": True, "error": 503, "code": "orchestrator_lost"}]
    assert "finalize_skipped_lost_request" in stalled.log_tail(200)
    assert await pending(redis, keys.requests, ORCHESTRATOR_GROUP) == 0
    # and the old owner is still a working orchestrator
    assert stalled.alive
    again = new_id("after-stall")
    await submit(redis, keys, "[[echo]] back", completion_id=again)
    assert (await read_until_terminal(redis, keys, again, timeout=20)).text == "back"


async def test_an_orchestrator_restarted_under_its_name_recovers_its_own_requests(procs, redis, keys, prefix):
    one = procs.orchestrator(AGENT, instance="orch-1", claim_idle=1)
    await procs.wait_ready(one)
    cid = new_id("restart")
    await submit(redis, keys, STREAMING, completion_id=cid)
    assert await started(redis, prefix, cid, chunks=2), procs.logs()
    again = procs.restart(one)  # SIGKILL, then the same command: the same consumer name
    await procs.wait_ready(again)
    outcome = await read_until_terminal(redis, keys, cid, timeout=30)
    assert outcome.error is not None and outcome.error["code"] == "orchestrator_lost", procs.logs()
    assert await finalize_log(redis, prefix, cid) == [
        {"by": "orch-1", "recovery": True, "error": 503, "code": "orchestrator_lost"}
    ]
    assert await pending(redis, keys.requests, ORCHESTRATOR_GROUP) == 0


async def test_requests_a_dead_orchestrator_had_not_started_are_run_not_failed(procs, redis, keys, prefix):
    one = procs.orchestrator(AGENT, instance="orch-1", claim_idle=1, concurrency=2)
    await procs.wait_ready(one)
    cids = [new_id(f"queued{n}") for n in range(4)]
    for cid in cids:
        await submit(redis, keys, "[[words:30]] [[delay:100]]", completion_id=cid)
    journal = Journal(redis, Keys(prefix))

    async def two_running():
        written = [await journal.written(cid) for cid in cids]
        return sum(w >= 1 for w in written) >= 2

    assert await wait_for(two_running, timeout=15), procs.logs()
    held = await redis.xpending(keys.requests, ORCHESTRATOR_GROUP)
    began = {cid for cid in cids if await journal.read(cid)}
    one.kill()

    async def dead() -> bool:
        return not one.alive

    assert await wait_for(dead, timeout=10)
    # a started stream whose client got text cannot go on unnoticed: it ends orchestrator_lost;
    # one whose client got no text yet (only the role chunk) goes on from its journal
    texted = {cid for cid in began if (await stream_sent(redis, keys.responses(cid))).text}
    two = procs.orchestrator(AGENT, instance="orch-2", claim_idle=1)
    await procs.wait_ready(two)

    outcomes = {cid: await read_until_terminal(redis, keys, cid, timeout=40) for cid in cids}
    lost = {cid for cid, o in outcomes.items() if o.error is not None}
    assert lost == texted, {c: o.terminal for c, o in outcomes.items()}
    for cid in cids:
        assert len(await finalize_log(redis, prefix, cid)) == 1
        assert outcomes[cid].error or outcomes[cid].text == " ".join(f"w{n}" for n in range(30))
    # orch-1 had fetched more than it ran: those were claimed and run from the start
    assert held["pending"] > len(began), held
    resumed = [cid for cid in cids if cid not in began and (await journal.read(cid)).get("recovered") == "1"]
    assert resumed, "a prefetched request should have been claimed and run by orch-2"
    assert await pending(redis, keys.requests, ORCHESTRATOR_GROUP) == 0
