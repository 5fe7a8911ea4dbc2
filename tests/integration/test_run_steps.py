"""A run's steps on record (hookbus.bus.store.run_steps): appended one command a step, read
back in order, a stalled owner's lines after its successor's ignored, deleted with the
request's terminal item, kept alive with its lease."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aredis

from hookbus.bus.keys import ORCHESTRATOR_GROUP, Keys
from hookbus.bus.store.journal import Journal, Lease, Leases
from hookbus.bus.store.run_steps import StepLog, StepRecord, replayable, stream_sent
from hookbus.bus.wire.envelopes import ResponseItem


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aredis.Redis]:
    client = aredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def step(key: str, epoch: int, **output: object) -> StepRecord:
    return StepRecord(key=key, epoch=epoch, by=f"orch-{epoch}", output=dict(output))


async def test_steps_are_read_back_in_order(client, prefix):
    log, cid = StepLog(client, Keys(prefix)), f"chatcmpl-{uuid.uuid4().hex[:8]}"
    await log.append(cid, step("on_connection", 1), first=True)
    await log.append(cid, step("llm_call#0", 1, answer="hi"), first=False)
    read = await log.read(cid)
    assert [(r.key, r.output) for r in read] == [("on_connection", {}), ("llm_call#0", {"answer": "hi"})]
    assert 0 < await client.ttl(Keys(prefix).steps(cid)) <= log.ttl


async def test_a_stalled_owners_lines_after_its_successors_are_ignored(client, prefix):
    log, cid = StepLog(client, Keys(prefix)), f"chatcmpl-{uuid.uuid4().hex[:8]}"
    await log.append(cid, step("on_connection", 1), first=True)
    await log.append(cid, step("before_llm_call#0", 2), first=False)  # the successor
    await log.append(cid, step("before_llm_call#0", 1, stale=True), first=False)  # the stalled one
    await log.append(cid, step("llm_call#0", 2), first=False)
    read = await log.read(cid)
    assert [(r.key, r.epoch) for r in read] == [("on_connection", 1), ("before_llm_call#0", 2), ("llm_call#0", 2)]


def test_a_line_cut_off_is_dropped():
    whole = step("on_connection", 1).model_dump_json()
    assert [r.key for r in replayable(f"{whole}\n{whole[:10]}".encode())] == ["on_connection"]
    assert replayable(None) == []


async def test_a_resumed_run_that_starts_the_key_again_drops_what_was_there(client, prefix):
    log, cid = StepLog(client, Keys(prefix)), f"chatcmpl-{uuid.uuid4().hex[:8]}"
    await log.append(cid, step("on_connection", 1), first=True)
    await log.append(cid, step("on_connection", 2), first=True)
    assert [(r.key, r.epoch) for r in await log.read(cid)] == [("on_connection", 2)]


async def test_finish_deletes_the_steps_and_renewal_keeps_them(client, prefix, redis_url):
    keys = Keys(prefix)
    cid = f"chatcmpl-{uuid.uuid4().hex[:8]}"
    requests = keys.requests_for(cid)
    entry = (await client.xadd(requests, {"e": b"{}"})).decode()
    await client.xgroup_create(requests, ORCHESTRATOR_GROUP, id="0")
    await client.xreadgroup(ORCHESTRATOR_GROUP, "me", {requests: ">"})
    journal = Journal(client, keys)
    assert (await journal.begin(cid, entry, "me", now=time.time())).ok
    log = StepLog(client, keys, ttl=5)
    await log.append(cid, step("on_connection", 1), first=True)

    sync = redis.Redis.from_url(redis_url)
    try:
        Leases(sync, keys, ttl=100).renew(ORCHESTRATOR_GROUP, "me", [Lease(entry, cid, 1)])
    finally:
        sync.close()
    assert 5 < await client.ttl(keys.steps(cid)) <= 100

    done = ResponseItem(kind="final", completion_id=cid, completion={})
    stored = await journal.finish(
        cid, keys.responses(cid), 1, [done], ttl=60, requests=requests, group=ORCHESTRATOR_GROUP,
        entry_id=entry, first_seq=0,
    )
    assert stored == 1
    assert not await client.exists(keys.steps(cid))


async def test_what_a_stream_sent_is_read_from_its_items(client, prefix):
    keys = Keys(prefix)
    cid = f"chatcmpl-{uuid.uuid4().hex[:8]}"
    journal = Journal(client, keys)
    entry = (await client.xadd(keys.requests_for(cid), {"e": b"{}"})).decode()
    assert (await journal.begin(cid, entry, "me", now=time.time())).ok

    def chunk(delta: dict[str, object]) -> ResponseItem:
        return ResponseItem(kind="chunk", completion_id=cid, chunk={"choices": [{"index": 0, "delta": delta}]})

    progress = ResponseItem(kind="progress", completion_id=cid, progress="hookbus: tool pay running")
    await journal.write(cid, keys.responses(cid), 1, [chunk({"role": "assistant"}), progress], ttl=60, first_seq=0)
    sent = await stream_sent(client, keys.responses(cid))
    assert (sent.items, sent.role, sent.text) == (2, True, False)
    await journal.write(cid, keys.responses(cid), 1, [chunk({"content": "w0"})], ttl=60, first_seq=2)
    sent = await stream_sent(client, keys.responses(cid))
    assert (sent.items, sent.role, sent.text) == (3, True, True)
