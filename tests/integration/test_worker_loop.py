"""The worker's read loop and the orchestrator's batched on_chunk hops, over real Redis."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from openai.types.chat import ChatCompletionChunk

from hookbus import Agent
from hookbus.bus.connection.retrying import connect
from hookbus.bus.keys import Keys
from hookbus.bus.wire.chunk_batch import ChunkIn, dump_chunks, load_results
from hookbus.bus.wire.envelopes import (
    HookRef,
    HopEvent,
    HopReply,
    decode,
    encode,
    encode_hop,
    encode_reply,
    hop_parts,
)
from hookbus.services.worker.host import GroupHost
from hookbus.services.worker.replica import WorkerReplica
from hookbus.skills import Context, HookData, PaymentRequired, Skill, hook
from hookbus.skills.builtin import ContentFilter
from tests.integration.stack import running_stack
from tests.streamed import chunks_in
from tests.waiting import wait_for


class Gate(Skill):
    """An on_chunk hook that waits until the test opens its gate: `first` for the first
    two chunks, `rest` for the others."""

    name = "gate"
    entered = 0
    first: asyncio.Event | None = None
    rest: asyncio.Event | None = None

    @hook("on_chunk")
    async def wait(self, data: HookData, ctx: Context) -> None:
        Gate.entered += 1
        gate = Gate.first if (data.chunk_index or 0) < 2 else Gate.rest
        assert gate is not None
        await gate.wait()


async def test_concurrency_bounds_prefetch_exactly_and_replies_are_batched(redis_url, prefix):
    Gate.entered, Gate.first, Gate.rest = 0, asyncio.Event(), asyncio.Event()
    keys = Keys(prefix)
    # acks held till the stop (ack_delay): the batcher's pipelines are then its replies' alone,
    # not also an ack's each time hops come further apart than the delay (a loaded machine)
    worker = WorkerReplica(
        GroupHost("gated", [Gate()]), redis_url, prefix=prefix, concurrency=2, replica="g-0", ack_delay=3600
    )
    client = connect(redis_url)
    reply_to = f"{prefix}test-replies"
    stream = keys.hooks("gated")
    await worker.start()
    running = True
    try:
        for n in range(6):
            event = HopEvent(
                hop_id=f"hop-{n}", completion_id="c", lifecycle="on_chunk", stage_key=f"on_chunk#{n}",
                hooks=[HookRef(skill="gate", method="wait")],
                data={"lifecycle": "on_chunk", "content": f"w{n}", "chunk_index": n},
                ctx={}, reply_to=reply_to, deadline=time.time() + 30,
            )
            await client.xadd(stream, encode(event))  # type: ignore[arg-type]

        async def entered(count: int) -> bool:
            return Gate.entered >= count

        assert await wait_for(lambda: entered(2), timeout=5)
        await asyncio.sleep(0.5)  # a "nothing more happens" check: a worker that read past its bound would have by now
        pending = await client.xpending(stream, "gated")
        assert pending["pending"] == 2  # read = in flight = --concurrency, nothing more
        assert Gate.entered == 2

        async def replies(count: int) -> list[HopReply] | None:
            found = [decode(fields, HopReply) for _, fields in await client.xrange(reply_to)]
            return found if len(found) >= count else None

        Gate.first.set()  # the two hooks in flight finish in one event-loop turn
        assert sorted(r.hop_id for r in await wait_for(lambda: replies(2), timeout=5) or []) == ["hop-0", "hop-1"]
        assert worker._batcher is not None and worker._batcher.batches == 1  # their replies in one pipeline
        assert await wait_for(lambda: entered(4), timeout=5)  # the next two read as the slots freed
        Gate.rest.set()
        found = await wait_for(lambda: replies(6), timeout=5) or []
        assert sorted(r.hop_id for r in found) == [f"hop-{n}" for n in range(6)]
        assert not any(r.failure for r in found)
        running = False
        await worker.stop()  # sends the acks it owes
        assert int((await client.xpending(stream, "gated"))["pending"]) == 0
    finally:
        Gate.first.set()
        Gate.rest.set()
        if running:
            await worker.stop()
        await client.aclose()


class Jitter(Skill):
    """A slow on_chunk hook that upper-cases; records the text so far each chunk showed it."""

    name = "jitter"
    seen: dict[int, str] = {}

    @hook("on_chunk")
    async def tag(self, data: HookData, ctx: Context) -> HookData:
        await asyncio.sleep(random.uniform(0, 0.004))  # the point: a slow hook, chunks gather meanwhile
        Jitter.seen[data.chunk_index or 0] = data.full_content or ""
        if data.content:
            data.content = data.content.upper()
        return data


def word_text(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


@pytest.mark.parametrize("batch", [64, 1])
async def test_on_chunk_hops_carry_the_chunks_that_gathered_and_keep_the_order(redis_url, prefix, batch):
    Jitter.seen = {}
    agent = Agent("batched", chunk_batch=batch)
    async with running_stack(redis_url, prefix, agent, {"jitter": [Jitter()]}, replicas=2) as (client, services, _):
        chunks = [c async for c in client.stream("[[words:60]]")]
        hops = services[0].runtime.hops
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == word_text(60).upper()
    model_chunks = len(Jitter.seen)  # role, 60 words, finish (and usage)
    assert model_chunks >= 62
    # each chunk's full_content is the model's text up to and including it, as one hop per chunk shows it
    assert [Jitter.seen[i] for i in range(1, 61)] == [word_text(n) for n in range(1, 61)]
    if batch == 1:
        assert hops == model_chunks
    else:
        assert hops < model_chunks / 2  # several chunks per hop


class LateCounter(Skill):
    """Writes ctx.state only from chunk 3 on, and shows in the text what it saw: a pipelined
    chunk sent with the older state must be sent again, so the result equals sequential."""

    name = "late-counter"

    @hook("on_chunk")
    async def count(self, data: HookData, ctx: Context) -> HookData:
        if (data.chunk_index or 0) >= 3 and data.content:
            seen = int(ctx.state.get("n", 0)) + 1
            ctx.state["n"] = seen
            data.content = f"{data.content}<{seen}>"
        return data


async def test_state_written_by_a_remote_on_chunk_hook_reaches_the_next_chunk(redis_url, prefix):
    async with running_stack(redis_url, prefix, Agent("late"), {"late": [LateCounter()]}) as (client, _, _):
        chunks = [c async for c in client.stream("[[words:12]]")]
    texts = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    words = [t for t in texts if t.strip()]
    numbered = [w for w in words if "<" in w]
    assert [int(w.split("<")[1].rstrip(">")) for w in numbered] == list(range(1, len(numbered) + 1))
    assert "".join(texts).startswith("w0 w1")


async def test_content_filter_holds_back_a_split_phrase_through_a_worker_group(redis_url, prefix):
    skills = [ContentFilter(flagged_words="top secret")]
    async with running_stack(redis_url, prefix, Agent("filtered"), {"filter": skills}, replicas=2) as (client, _, _):
        chunks = [c async for c in client.stream("[[echo]] a top secret plan, top dog and top secret")]
    texts = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(texts) == "a [filtered] plan, top dog and [filtered]"




class Looker(Skill):
    name = "looker"

    @hook("on_chunk")
    async def look(self, data: HookData, ctx: Context) -> None:
        ctx.state["looked"] = True


class Changer(Skill):
    name = "changer"

    @hook("on_chunk")
    async def change(self, data: HookData, ctx: Context) -> HookData:
        data.content = "changed"
        return data


class InPlace(Skill):
    """Edits the chunk deep inside, in place, and says "unchanged" (returns None)."""

    name = "in-place"

    @hook("on_chunk")
    async def edit(self, data: HookData, ctx: Context) -> None:
        assert data.chunk is not None
        data.chunk.choices[0].delta.content = "edited"


def _chunk(index: int) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate({
        "id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"content": f"w{index}"}, "finish_reason": None}],
    })


def _chunk_data(index: int) -> HookData:
    return HookData(lifecycle="on_chunk", chunk=_chunk(index), content=f"w{index}", chunk_index=index)


def _chunks(n: int) -> list[ChunkIn]:
    """A batch as the orchestrator sends it: chunk `i` says "w{i}"."""
    return chunks_in([(_chunk(i), f"w{i}") for i in range(n)])


async def test_split_hops_reply_without_data_unless_the_hooks_changed_it():
    data = _chunk_data(0)
    ctx = Context()
    for skill, changed in ((Looker(), False), (Changer(), True), (InPlace(), True)):
        event = HopEvent(
            hop_id="h", completion_id="c", lifecycle="on_chunk", stage_key="on_chunk#0",
            hooks=[HookRef(skill=skill.name, method=next(iter(skill.bound_hooks())).descriptor.method)],
            ctx={}, reply_to="r", deadline=time.time() + 5,
        )
        fields = encode_hop(event, data.model_dump_json().encode(), ctx.model_dump_json().encode())
        assert set(fields) == {b"e", b"c", b"d"} and b'"content"' not in fields[b"e"]
        decoded = decode(fields, HopEvent)
        reply = await GroupHost("g", [skill]).answer(decoded, 1, "r-1", hop_parts(decoded, fields))
        back = decode(encode_reply(reply), HopReply)
        assert back.v == 2 and back.data is None and not back.failure
        if changed:
            assert back.data_json is not None
            changed_data = HookData.model_validate_json(back.data_json)
            # content and the chunk's text are one value once a hook rewrote either (docs/hooks.md)
            assert (changed_data.content, changed_data.chunk.choices[0].delta.content) in (  # type: ignore[union-attr]
                ("changed", "changed"), ("edited", "edited"),
            )
        else:
            assert back.data_json is None and back.state == {"looked": True}


def test_a_reply_data_comes_from_the_d_field_alone():
    reply = HopReply(hop_id="h", completion_id="c", replica="r", v=2, data_json=b'{"lifecycle": "on_chunk"}')
    fields = encode_reply(reply)
    assert fields[b"d"] == b'{"lifecycle": "on_chunk"}' and b"data_json" not in fields[b"e"]
    assert decode(fields, HopReply).data_json == fields[b"d"]
    claimed = fields[b"e"].replace(b'"replica"', b'"data_json":"{}","replica"')
    assert decode({b"e": claimed}, HopReply).data_json is None
    v1 = claimed.replace(b'"v":2', b'"v":1')
    assert decode({b"e": v1, b"d": b"{}"}, HopReply).data_json is None  # a version 1 reply has no `d`
    assert "data_json" not in HopReply.model_json_schema()["properties"]


class StopAtFive(Skill):
    name = "stop-at-five"

    @hook("on_chunk")
    async def stop(self, data: HookData, ctx: Context) -> None:
        await asyncio.sleep(random.uniform(0, 0.005))  # the point: hops finish out of order
        if data.chunk_index == 5:
            raise PaymentRequired("out of credit mid-answer")


async def test_an_error_on_a_batched_chunk_ends_the_stream_there(redis_url, prefix):
    async with running_stack(redis_url, prefix, Agent("stop"), {"stop": [StopAtFive()]}, replicas=2) as (client, _, _):
        texts: list[str] = []
        try:
            async for chunk in client.stream("[[words:40]]"):
                texts.extend(c.delta.content or "" for c in chunk.choices)
        except PaymentRequired:
            pass
        else:
            raise AssertionError("expected a 402")
    assert "".join(texts) == "w0 w1 w2 w3"  # chunk 0 is the role delta, chunk 5 " w4" raised


class EveryOther(Skill):
    """Counts chunks in ctx.state and blanks every odd one: state carries from chunk to chunk."""

    name = "every-other"

    @hook("on_chunk")
    async def drop(self, data: HookData, ctx: Context) -> HookData | None:
        ctx.state["n"] = ctx.state.get("n", 0) + 1
        if (data.chunk_index or 0) % 2:
            data.content = ""
            return data
        return None


async def test_a_batch_reply_carries_only_the_changed_chunks_and_the_state_they_left():
    """Protocol 1.0, as an orchestrator of an older build sends it: the text so far on the first chunk."""
    chunks = _chunks(3)
    event = HopEvent(
        hop_id="h", completion_id="c", lifecycle="on_chunk", stage_key="on_chunk#0", chunks=3,
        hooks=[HookRef(skill="every-other", method="drop")], ctx={}, reply_to="r", deadline=time.time() + 5,
    )
    fields = encode_hop(event, dump_chunks(chunks, kept=False), Context().model_dump_json().encode())
    assert fields[b"d"].count(b"full_content") == 1  # the text so far travels once
    decoded = decode(fields, HopEvent)
    reply = await GroupHost("g", [EveryOther()]).answer(decoded, 1, "r-1", hop_parts(decoded, fields))
    back = decode(encode_reply(reply), HopReply)
    assert not back.failure and back.processed == 3 and back.state == {"n": 3}
    assert back.data_json is not None
    results = load_results(back.data_json, kept=False)
    assert results[0] is None and results[2] is None
    assert results[1] is not None and results[1].content == "" and results[1].full_content == "w0w1"


async def test_a_chunk_a_hook_edited_in_place_counts_as_changed_in_a_batch():
    chunks = _chunks(2)
    event = HopEvent(
        hop_id="h", completion_id="c", lifecycle="on_chunk", stage_key="on_chunk#0", chunks=2,
        hooks=[HookRef(skill="in-place", method="edit")], ctx={}, reply_to="r", deadline=time.time() + 5,
    )
    fields = encode_hop(event, dump_chunks(chunks, kept=False), Context().model_dump_json().encode())
    decoded = decode(fields, HopEvent)
    back = decode(encode_reply(await GroupHost("g", [InPlace()]).answer(decoded, 1, "r-1", hop_parts(decoded, fields))), HopReply)
    assert back.data_json is not None
    assert [r.chunk.choices[0].delta.content for r in load_results(back.data_json, kept=False)] == ["edited", "edited"]  # type: ignore[union-attr]
