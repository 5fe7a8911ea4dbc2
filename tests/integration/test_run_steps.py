"""A run's steps on record (hookbus.bus.store.run_steps): fields of the request's journal,
read back in order, a stalled owner's steps after its successor's ignored, blanked with the
request's terminal item."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aredis

from hookbus import Agent
from hookbus.bus.keys import ORCHESTRATOR_GROUP, Keys
from hookbus.bus.store.journal import Journal
from hookbus.bus.store.run_steps import (
    STEP_FIELD,
    StepLog,
    StepRecord,
    replayable,
    step_field,
    stream_sent,
)
from hookbus.bus.wire.envelopes import ResponseItem
from hookbus.skills import Skill, hook
from tests.integration.stack import Notes, running_stack


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aredis.Redis]:
    client = aredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def step(key: str, epoch: int, **output: object) -> StepRecord:
    return StepRecord(key=key, epoch=epoch, by=f"orch-{epoch}", output=dict(output))


async def begun(client: aredis.Redis, keys: Keys) -> tuple[Journal, str, str]:
    """A journal begun for a new request whose entry is delivered to us."""
    cid = f"chatcmpl-{uuid.uuid4().hex[:8]}"
    requests = keys.requests_for(cid)
    entry = (await client.xadd(requests, {"e": b"{}"})).decode()
    await client.xgroup_create(requests, ORCHESTRATOR_GROUP, id="0")
    await client.xreadgroup(ORCHESTRATOR_GROUP, "me", {requests: ">"})
    journal = Journal(client, keys)
    assert (await journal.begin(cid, entry, "me", now=time.time())).ok
    return journal, cid, entry


async def test_steps_are_read_back_in_order_and_blanked_at_the_end(client, prefix):
    keys = Keys(prefix)
    journal, cid, entry = await begun(client, keys)
    log = StepLog(client, keys)
    fields = [
        *await log.append(cid, [(0, step("on_connection", 1))]),
        *await log.append(cid, [(1, step("llm_call#0", 1, answer="hi"))]),
    ]
    found = await log.resumption(cid)
    assert [(r.key, r.output) for r in found.records] == [("on_connection", {}), ("llm_call#0", {"answer": "hi"})]
    assert sorted(found.fields) == sorted(fields) == [step_field(0, 1), step_field(1, 1)]

    done = ResponseItem(kind="final", completion_id=cid, completion={})
    stored = await journal.finish(
        cid, keys.responses(cid), 1, [done], ttl=60, requests=keys.requests_for(cid),
        group=ORCHESTRATOR_GROUP, entry_id=entry, first_seq=0, steps=fields,
    )
    assert stored == 1
    after = await journal.read(cid)
    assert after["done"] == "1" and all(after[name] == "" for name in fields)
    assert (await log.resumption(cid)).records == []


def test_a_stalled_owners_steps_after_its_successors_are_ignored():
    def line(key: str, epoch: int) -> str:
        return step(key, epoch).model_dump_json()

    journal = {
        "owner": "orch-2", "stage": "started",
        step_field(0, 1): line("on_connection", 1),
        step_field(1, 2): line("before_llm_call#0", 2),  # the successor
        step_field(1, 1): line("before_llm_call#0", 1),  # the stalled one, after the claim
        step_field(2, 1): line("llm_call#0", 1),  # the stalled one: not after the successor's
    }
    assert [(r.key, r.epoch) for r in replayable(journal)] == [("on_connection", 1), ("before_llm_call#0", 2)]


def test_steps_end_at_a_gap_a_blank_or_a_record_that_cannot_be_read():
    whole = step("on_connection", 1).model_dump_json()
    assert [r.key for r in replayable({step_field(0, 1): whole, step_field(2, 1): whole})] == ["on_connection"]
    assert replayable({step_field(0, 1): ""}) == []
    assert replayable({step_field(0, 1): whole[:10]}) == []


async def test_what_a_stream_sent_is_read_from_its_items(client, prefix):
    keys = Keys(prefix)
    journal, cid, _ = await begun(client, keys)

    def chunk(delta: dict[str, object]) -> ResponseItem:
        return ResponseItem(kind="chunk", completion_id=cid, chunk={"choices": [{"index": 0, "delta": delta}]})

    progress = ResponseItem(kind="progress", completion_id=cid, progress="hookbus: tool pay running")
    await journal.write(cid, keys.responses(cid), 1, [chunk({"role": "assistant"}), progress], ttl=60, first_seq=0)
    sent = await stream_sent(client, keys.responses(cid))
    assert (sent.items, sent.role, sent.text) == (2, True, False)
    await journal.write(cid, keys.responses(cid), 1, [chunk({"content": "w0"})], ttl=60, first_seq=2)
    sent = await stream_sent(client, keys.responses(cid))
    assert (sent.items, sent.role, sent.text) == (3, True, True)


class Closing(Skill):
    """A finalize_connection hook: the stages before it are then on record when it starts."""

    name = "closing"

    @hook("finalize_connection")
    async def close(self, data, ctx):
        ctx.state["closed"] = True
        return data


async def recorded_steps(client, *cids: str) -> dict[str, list[int]]:
    """The step numbers a request's journal has fields for (blanked by its end, not removed)."""
    journal = Journal(client.redis, client.keys)
    return {
        cid: sorted(int(name.split(":")[1]) for name in await journal.read(cid) if name.startswith(STEP_FIELD))
        for cid in cids
    }


@pytest.mark.parametrize("finalize_hook", [False, True], ids=["no finalize hook", "a finalize hook"])
async def test_a_stream_records_no_step_from_its_first_text_on(redis_url, prefix, finalize_hook):
    """The same request with one tool round, whole and streamed: the stream's record ends
    before the LLM call whose text its client gets (a takeover from there ends the stream
    `orchestrator_lost` if text reached the client, and else runs that call again), so that
    call, after_llm_call and on_message cost it nothing. The whole answer records every
    step up to its last LLM call; the stages after it (after_llm_call, on_message) are
    written before finalize only when finalize has a hook to run, whose takeover must not
    run them again: with none, the request's end would only blank them."""
    prompt = '[[tool:remember {"note": "milk"}]]'
    agent = Agent("steps", skills=[Closing()] if finalize_hook else [])
    async with running_stack(redis_url, prefix, agent, {"notes": [Notes()]}) as (client, _, _):
        whole = await client.complete(prompt)
        chunks = [chunk async for chunk in client.stream(prompt)]
        recorded = await recorded_steps(client, whole.id, chunks[0].id)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and "noted (1)" in text
    # on_connection, then per round before_llm_call, llm_call, after_llm_call, the tool's
    # three steps in round 0, and on_message
    assert recorded[whole.id] == list(range(11 if finalize_hook else 9)), recorded
    assert recorded[chunks[0].id] == list(range(8)), recorded
