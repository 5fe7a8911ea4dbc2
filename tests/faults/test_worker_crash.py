"""Worker replicas that die (SIGKILL) or live long: real `hookbus worker` processes."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from hookbus.bus.wire.envelopes import HopReply, decode
from hookbus.services.cli.monitor import recent_events
from tests.faults.fault_skills import fault_key
from tests.faults.helpers import (
    read_until_terminal,
    recording,
    runs,
    submit,
    terminal_count,
    version_stream,
)
from tests.waiting import wait_for

SLOW = "tests.faults.fault_skills:Slow"
MARK = "tests.faults.fault_skills:Mark"
POISON = "tests.faults.fault_skills:Poison"
AGENT = "tests.faults.fault_skills:agent"

pytestmark = pytest.mark.slow


def new_id(tag: str) -> str:
    return f"chatcmpl-{tag}-{uuid.uuid4().hex[:8]}"


async def _kill_mid_hook(procs, redis, keys, prefix, tag: str, text: str, *others):
    """Two Slow replicas and an orchestrator (and `others`, already spawned); a request
    whose Slow hook holds on its first delivery; the replica that took it killed there.
    Returns the completion id, the victim, its sibling and the request's outcome."""
    a = procs.worker("slow", SLOW, replica="slow-a", claim_idle=1)
    b = procs.worker("slow", SLOW, replica="slow-b", claim_idle=1)
    orchestrator = procs.orchestrator(AGENT, instance="orch-1", claim_idle=1)
    await procs.wait_ready(*others, a, b, orchestrator)

    cid = new_id(tag)
    await submit(redis, keys, text, completion_id=cid)
    first = await wait_for(lambda: runs(redis, prefix, cid), timeout=15)
    assert first, procs.logs()
    victim, sibling = (a, b) if first[0]["by"] == "slow-a" else (b, a)
    victim.kill()

    outcome = await read_until_terminal(redis, keys, cid, timeout=30)
    assert outcome.terminal is not None and outcome.terminal.kind == "done", (outcome.terminal, procs.logs())
    return cid, victim, sibling, outcome


async def test_a_replica_killed_mid_hook_leaves_the_hop_to_its_sibling(procs, redis, keys, prefix):
    cid, victim, sibling, outcome = await _kill_mid_hook(
        procs, redis, keys, prefix, "kill-worker", "hold=30 holdfirst [[echo]] still here"
    )
    assert "still here" in outcome.text
    deliveries = await runs(redis, prefix, cid)
    assert [(d["by"], d["attempt"]) for d in deliveries] == [(victim.name, 1), (sibling.name, 2)]
    # the idempotency key is stable across deliveries: completion id, stage, hook
    assert deliveries[0]["key"] == deliveries[1]["key"] == f"{cid}:on_connection:slow.hold"
    hops = [
        e for e in await recent_events(redis, keys)
        if e.completion_id == cid and e.kind == "hop" and e.lifecycle == "on_connection"
    ]
    assert [(h.replica, h.outcome) for h in hops] == [(sibling.name, "ok")]
    assert await terminal_count(redis, keys, cid) == 1


async def test_a_replica_killed_mid_hook_on_a_hop_sent_on_leaves_it_to_its_sibling(
    procs, redis, redis_url, keys, prefix
):
    """The stage is sent on from group `mark` to group `slow` by mark's worker (a route);
    the slow replica that took the hop dies in its hook: its sibling claims the hop the
    orchestrator never sent, with mark's changes in it, and the request ends once."""
    marker = procs.worker("mark", MARK, replica="mark-a", claim_idle=1)
    async with recording(redis_url, keys.replies("orch-1")) as entries:
        cid, victim, sibling, outcome = await _kill_mid_hook(
            procs, redis, keys, prefix, "kill-routed", "hold=30 holdfirst [[echo]] routed", marker
        )
    assert outcome.text == "hold=30 holdfirst routed (marked)"
    deliveries = await runs(redis, prefix, cid)
    assert [(d["by"], d["attempt"], d["marked"]) for d in deliveries] == [
        (victim.name, 1, "mark-a"), (sibling.name, 2, "mark-a"),
    ]
    # mark's reply names the hop it sent on: the orchestrator waited for that one
    replies = [decode(fields, HopReply) for fields in entries if b"wake" not in fields]
    sent_on = {r.forwarded for r in replies if r.completion_id == cid and r.replica == "mark-a"}
    assert len(sent_on) == 1 and None not in sent_on
    assert [r.replica for r in replies if r.completion_id == cid and r.hop_id in sent_on] == [sibling.name]
    assert await terminal_count(redis, keys, cid) == 1
    assert await redis.get(fault_key("finalize", cid, prefix=prefix)) == b"1"


async def test_a_long_hook_on_a_live_replica_keeps_its_claim(procs, redis, keys, prefix):
    a = procs.worker("slow", SLOW, replica="slow-a", claim_idle=1)
    b = procs.worker("slow", SLOW, replica="slow-b", claim_idle=1)
    orchestrator = procs.orchestrator(AGENT, instance="orch-1", claim_idle=1)
    await procs.wait_ready(a, b, orchestrator)

    cid = new_id("long-hook")
    await submit(redis, keys, "hold=3.5 [[echo]] patience", completion_id=cid)  # 3.5 x claim_idle
    outcome = await read_until_terminal(redis, keys, cid, timeout=30)
    assert outcome.terminal is not None and outcome.terminal.kind == "done", procs.logs()
    deliveries = await runs(redis, prefix, cid)
    assert len(deliveries) == 1 and deliveries[0]["attempt"] == 1, deliveries


async def test_a_poison_hop_that_kills_every_replica_ends_in_the_dead_letter_stream(procs, redis, keys, prefix):
    replicas = [
        procs.worker("poison", POISON, replica=f"poison-{n}", claim_idle=1, max_deliveries=2)
        for n in range(3)
    ]
    orchestrator = procs.orchestrator(AGENT, instance="orch-1", claim_idle=1)
    await procs.wait_ready(*replicas, orchestrator)

    cid = new_id("poison")
    await submit(redis, keys, "poison [[echo]] survived the poison", completion_id=cid)
    outcome = await read_until_terminal(redis, keys, cid, timeout=40)
    assert outcome.terminal is not None, procs.logs()
    # the hop failed as a whole: a non-critical hook failing leaves the data unchanged
    assert outcome.terminal.kind == "done"
    assert outcome.text == "poison survived the poison"
    assert sum(not r.alive for r in replicas) == 2  # two deliveries, two crashes; the third set it aside
    letters = await redis.xrange(keys.dead_letter)
    stream = await version_stream(redis, keys, "poison")
    ours = [f for _id, f in letters if f[b"source"] == stream.encode()]
    assert len(ours) == 1
    assert b"delivered 3 times" in ours[0][b"reason"]

    async def on_connection_stages():  # monitor records are flushed in batches, after the answer
        return [
            e for e in await recent_events(redis, keys)
            if e.completion_id == cid and e.kind == "stage" and e.lifecycle == "on_connection"
        ]

    stages = await wait_for(on_connection_stages, timeout=5)
    assert stages and stages[0].outcome == "hop_failed" and "dead-lettered" in (stages[0].error or "")
    assert await redis.xpending(stream, "poison") == {
        "pending": 0, "min": None, "max": None, "consumers": [],
    }
    await asyncio.sleep(1.0)  # nothing more comes after the terminal item
    assert await terminal_count(redis, keys, cid) == 1
