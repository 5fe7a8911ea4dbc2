"""Acks that follow their replies (ReplyBatcher): a replica killed between a reply and its
ack leaves the hop pending, a sibling runs it again and the caller ignores the duplicate
reply; a replica stopped with SIGTERM sends the acks it owes first."""

from __future__ import annotations

import pytest

from tests.faults.helpers import (
    pending,
    read_until_terminal,
    runs,
    submit,
    terminal_count,
    version_stream,
)
from tests.faults.test_worker_crash import AGENT, SLOW, new_id
from tests.waiting import wait_for

LAZY_ACKS = "tests.faults.lazy_ack_worker"

pytestmark = pytest.mark.slow


async def answered_but_unacked(procs, redis, keys, prefix):  # type: ignore[no-untyped-def]
    """A request answered through the lazy-ack replica, whose hop stays pending."""
    lazy = procs.worker_module(LAZY_ACKS, group="slow", replica="lazy-a")
    orchestrator = procs.orchestrator(AGENT, instance="orch-1", claim_idle=1)
    await procs.wait_ready(lazy, orchestrator)
    cid = new_id("unacked")
    await submit(redis, keys, "[[echo]] answered once", completion_id=cid)
    outcome = await read_until_terminal(redis, keys, cid, timeout=30)
    assert outcome.terminal is not None and outcome.terminal.kind == "done", procs.logs()
    assert "answered once" in outcome.text
    assert [(r["by"], r["attempt"]) for r in await runs(redis, prefix, cid)] == [("lazy-a", 1)]
    assert await pending(redis, await version_stream(redis, keys, "slow"), "slow") == 1  # replied, its ack still owed
    return lazy, orchestrator, cid


async def test_a_replica_killed_between_reply_and_ack_has_its_hop_rerun_and_the_duplicate_ignored(procs, redis, keys, prefix):
    lazy, orchestrator, cid = await answered_but_unacked(procs, redis, keys, prefix)
    lazy.kill()
    sibling = procs.worker("slow", SLOW, replica="slow-b", claim_idle=1)
    await procs.wait_ready(sibling)

    async def rerun() -> bool:
        return len(await runs(redis, prefix, cid)) == 2 and await pending(redis, await version_stream(redis, keys, "slow"), "slow") == 0

    assert await wait_for(rerun, timeout=20), procs.logs()
    assert [(r["by"], r["attempt"]) for r in await runs(redis, prefix, cid)] == [("lazy-a", 1), ("slow-b", 2)]

    assert await terminal_count(redis, keys, cid) == 1  # the request's answer is untouched
    # the orchestrator goes on serving; its reply reader, which reads nothing while no hop
    # waits, reads the duplicate reply with the next request's first hop and drops it
    after = new_id("after")
    await submit(redis, keys, "[[echo]] and again", completion_id=after)
    outcome = await read_until_terminal(redis, keys, after, timeout=30)
    assert outcome.terminal is not None and outcome.terminal.kind == "done", procs.logs()
    assert "and again" in outcome.text

    async def ignored() -> bool:
        return "late_reply_ignored" in orchestrator.log_tail(200)

    assert await wait_for(ignored, timeout=10), procs.logs()
    assert await terminal_count(redis, keys, cid) == 1


async def test_a_replica_never_reclaims_the_hops_it_answered_while_their_acks_wait(procs, redis, keys, prefix):
    """An answered entry waiting for its deferred ack is not an orphan of its own replica,
    however long the ack waits (it was, on a loaded machine: ack_delay past claim_idle)."""
    lazy, _, cid = await answered_but_unacked(procs, redis, keys, prefix)
    stream = await version_stream(redis, keys, "slow")

    async def idle_for_three_claim_passes() -> bool:
        [entry] = await redis.xpending_range(stream, "slow", min="-", max="+", count=1)
        return int(entry["time_since_delivered"]) > 3_000  # claim_idle is 1 s

    assert await wait_for(idle_for_three_claim_passes, timeout=30), lazy.log_tail()
    assert [(r["by"], r["attempt"]) for r in await runs(redis, prefix, cid)] == [("lazy-a", 1)]
    assert '"event": "claimed"' not in lazy.log_tail(200)
    assert await pending(redis, stream, "slow") == 1


async def test_a_replica_stopped_with_sigterm_sends_the_acks_it_owes(procs, redis, keys, prefix):
    lazy, _, _ = await answered_but_unacked(procs, redis, keys, prefix)
    stream = await version_stream(redis, keys, "slow")  # named before the replica leaves with its version
    lazy.terminate()
    assert lazy.popen.returncode == 0, lazy.log_tail()
    assert await pending(redis, stream, "slow") == 0
