"""Protocol 1.1's batched on_chunk hops (bus/wire/stream_text.py): a hop carries its new
chunks, never the text so far; the replica that runs it keeps the stream's text, so every
hook still reads the right `full_content`; a replica that lacks it asks, and the batch sent
again with the text runs anywhere."""

from __future__ import annotations

import time

from openai.types.chat import ChatCompletionChunk

from hookbus.bus.wire.chunk_batch import ChunkIn, dump_chunks, load_results
from hookbus.bus.wire.envelopes import (
    HookRef,
    HopEvent,
    HopReply,
    decode,
    encode_hop,
    encode_reply,
    hop_parts,
)
from hookbus.bus.wire.stream_text import ChunkText, KeptTexts, StreamText
from hookbus.services.worker.host import GroupHost
from hookbus.skills import Context, HookData, Skill, hook
from tests.streamed import chunks_in

WORD = "abcdefghij" * 10
"""Each chunk's text: 100 characters."""


def _chunk(text: str) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate({
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    })


def _stream(n: int, start: int = 0) -> list[ChunkIn]:
    return chunks_in([(_chunk(f"{i:04d}{WORD}"), f"{i:04d}{WORD}") for i in range(n)], start)


class Reads(Skill):
    """Records what each chunk's hook saw; upper-cases every fifth chunk."""

    name = "reads"

    def __init__(self) -> None:
        self.seen: list[tuple[int, str]] = []

    @hook("on_chunk")
    async def read(self, data: HookData, ctx: Context) -> HookData | None:
        self.seen.append((data.chunk_index or 0, data.full_content or ""))
        if (data.chunk_index or 0) % 5 == 0:
            data.content = (data.content or "").upper()
            return data
        return None


async def _hop(host: GroupHost, chunks: list[ChunkIn], replica: str, *, whole: bool = False) -> tuple[HopReply, int]:
    """One 1.1 hop through the wire's encoding, naming the text as the orchestrator does for
    the live replicas "one" and "two"; the reply and the bytes of its entry."""
    stream = chunks[0].text
    event = HopEvent(
        hop_id="h", completion_id="c", lifecycle="on_chunk", stage_key=f"on_chunk#{chunks[0].index}",
        chunks=len(chunks), hooks=[HookRef(skill="reads", method="read")], ctx={}, reply_to="r",
        deadline=time.time() + 5, text=stream.ref_for(chunks[0].index, ["one", "two"], whole=whole),
    )
    fields = encode_hop(event, dump_chunks(chunks, kept=True), Context().model_dump_json().encode())
    decoded = decode(fields, HopEvent)
    reply = decode(encode_reply(await host.answer(decoded, 1, replica, hop_parts(decoded, fields))), HopReply)
    stream.answered(replica, None if reply.needs_text else chunks[0].index + reply.processed)
    return reply, len(fields[b"d"]) + len(fields[b"e"])


async def test_hops_carry_their_chunks_only_and_hooks_read_the_text_so_far_across_replicas() -> None:
    """Two replicas take turns over a stream: each hop carries its chunks and what the other
    replica lacks (the whole text so far while one has not answered the stream yet, then
    the batch before), never the text so far once per hop. Replica "two" restarts: it lacks
    the text it is sent a gap for, asks, and gets the batch again with the whole text."""
    chunks = _stream(80, start=7)  # a second LLM call of its request: its chunk_index starts at 7
    text = "".join(c.content for c in chunks)
    one, two = Reads(), Reads()
    hosts = {"one": GroupHost("g", [one]), "two": GroupHost("g", [two])}
    batches = [chunks[i : i + 10] for i in range(0, 80, 10)]
    sent = 0
    asked = []
    for n, replica in enumerate(["one", "one", "two", "one", "two", "one", "two", "two"]):
        if n == 6:
            hosts["two"] = GroupHost("g", [two])  # restarted: it kept nothing
        reply, size = await _hop(hosts[replica], batches[n], replica)
        sent += size
        if reply.needs_text:
            asked.append(n)
            assert reply.processed == 0  # and no hook ran
            reply, size = await _hop(hosts[replica], batches[n], replica, whole=True)
            sent += size
        assert not reply.needs_text and reply.processed == 10
    assert asked == [6]
    seen = sorted(one.seen + two.seen)
    assert [i for i, _ in seen] == list(range(7, 87))
    for index, full in seen:
        assert full == text[: (index - 7 + 1) * len(chunks[0].content)]
    assert sent < 3 * len(text) + 80 * 400, sent


async def test_a_changed_chunk_comes_back_without_the_text_so_far() -> None:
    chunks = _stream(10)
    reply, _ = await _hop(GroupHost("g", [Reads()]), chunks, "one")
    assert reply.data_json is not None and b"full_content" not in reply.data_json
    results = load_results(reply.data_json, kept=True)
    changed = [(r, c) for r, c in zip(results, chunks, strict=True) if r is not None]
    assert [c.index for _, c in changed] == [0, 5]
    assert all(r.full_content is None and r.content == c.content.upper() for r, c in changed)


async def test_a_batch_of_a_protocol_1_0_orchestrator_still_carries_and_gets_the_text() -> None:
    chunks = _stream(6)
    reads = Reads()
    event = HopEvent(
        hop_id="h", completion_id="c", lifecycle="on_chunk", stage_key="on_chunk#3", chunks=3,
        hooks=[HookRef(skill="reads", method="read")], ctx={}, reply_to="r", deadline=time.time() + 5,
    )
    raw = dump_chunks(chunks[3:], kept=False)
    assert raw.count(b"full_content") == 1 and raw.count(b'},"content":') == 3  # HookData's, after its chunk
    fields = encode_hop(event, raw, Context().model_dump_json().encode())
    decoded = decode(fields, HopEvent)
    reply = await GroupHost("g", [reads]).answer(decoded, 1, "r-1", hop_parts(decoded, fields))
    assert reply.processed == 3 and not reply.needs_text
    assert reads.seen == [(i, chunks[i].full) for i in (3, 4, 5)]


def test_a_1_1_batch_leaves_out_the_text_so_far_and_each_chunk_s_own_text() -> None:
    raw = dump_chunks(_stream(3), kept=True)
    assert b"full_content" not in raw and b'},"content":' not in raw
    assert raw.count(WORD.encode()) == 3  # each chunk's text once, in its chunk


def test_the_orchestrator_joins_the_text_only_when_asked_and_sends_what_replicas_lack() -> None:
    text = StreamText(4)
    counts = [text.add(part) for part in ("a", "", "bc", "d", "e")]
    assert counts == [1, 2, 3, 4, 5]
    assert text.upto(3) == "abc" and text.upto(1) == "a" and text.upto(5) == "abcde" and text.upto(0) == ""
    assert StreamText(0).ref.stream != text.ref.stream  # one id per call
    assert text.ref_for(6, []).gap is None  # no live replica: nothing to send
    unknown = text.ref_for(6, ["r1"])  # r1 has not answered the stream: the whole text so far
    assert (unknown.gap_from, unknown.gap) == (4, ["a", ""])
    text.answered("r1", 6)
    text.answered("r2", 5)
    assert text.ref_for(6, ["r1"]).gap is None
    late = text.ref_for(8, ["r1", "r2"])
    assert (late.gap_from, late.gap) == (5, ["", "bc", "d"])  # chunks 5 to 7, for r2
    assert text.ref_for(8, ["r1"]).gap_from == 6  # r2 is gone: not waited for
    whole = text.ref_for(8, ["r1"], whole=True)
    assert (whole.gap_from, whole.gap) == (4, ["a", "", "bc", "d"])
    text.answered("r2", None)  # it lacked the text: the next hops bring it all
    assert text.ref_for(8, ["r1", "r2"]).gap_from == 4


def test_a_replica_extends_what_it_kept_with_the_gap_it_is_sent() -> None:
    texts = KeptTexts()
    ref = ChunkText(stream="s", start=2)
    texts.keep(ref, "ab", 4)
    gap = ref.model_copy(update={"gap_from": 3, "gap": ["b", "c", "d"]})
    assert texts.take(gap, 6) == "abcd"  # it holds through chunk 3: the gap from 4 on
    texts.keep(ref, "abcd", 6)
    assert texts.take(ref.model_copy(update={"gap_from": 7, "gap": ["x"]}), 8) is None  # a gap after its end
    assert texts.take(ref.model_copy(update={"gap_from": 2, "gap": ["a", "b"]}), 4) == "ab"  # the whole text


def test_a_replica_forgets_the_least_recently_used_stream_past_its_bound() -> None:
    texts = KeptTexts(max_chars=10)
    a, b = ChunkText(stream="a", start=0), ChunkText(stream="b", start=0)
    texts.keep(a, "123456", 3)
    texts.keep(b, "7890", 2)
    assert len(texts) == 2
    texts.keep(a, texts.take(a, 3) + "xy", 5)  # type: ignore[operator]
    assert texts.take(b, 2) is None  # forgotten: over 10 characters with it
    assert texts.take(a, 5) == "123456xy"
    assert texts.take(a, 5) is None  # taken out while its batch runs
    assert texts.take(a, 0) == ""  # a stream's first batch needs no text
