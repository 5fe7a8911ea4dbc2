"""An observer entry's on_chunk stages written from the chunk as it came (the path of a
stream whose on_chunk stage has only observers) are what the HookData's own dump gives,
and read back to the same stages."""

from __future__ import annotations

import dataclasses
import json

from openai.types.chat import ChatCompletionChunk

from hookbus.bus.wire.chunk_batch import ChunkIn
from hookbus.bus.wire.envelopes import decode
from hookbus.bus.wire.observations import BatchWriter, ObservationBatch
from hookbus.bus.wire.stream_text import StreamText
from hookbus.skills import Context
from tests.streamed import chunks_in


def chunk(text: str, finish: str | None = None) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate({
        "id": "chatcmpl-entries", "object": "chat.completion.chunk", "created": 1, "model": "offline",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
    })


def stream(held: bool) -> list[ChunkIn]:
    words = ["Look ", "it ", "", "up."]
    chunks = chunks_in([(chunk(word, "stop" if index == len(words) - 1 else None), word) for index, word in enumerate(words)])
    chunks = [dataclasses.replace(c, held="it " if held and c.index else None) for c in chunks]
    other = StreamText(len(words))  # not the last text plus more
    chunks.append(ChunkIn(chunk("", None), "", len(words), other, other.add("rewritten")))
    return chunks


def entry(chunks: list[ChunkIn], *, from_chunk: bool) -> dict[bytes, bytes]:
    writer = BatchWriter("audit")
    for n, c in enumerate(chunks):
        args = (["audit.watch"], f"on_chunk#{c.index}", 10.0 + n, 10.5 + n, b'{"n":1}')
        if from_chunk:
            writer.add_chunk(c, *args)
        else:
            writer.add(c.data(), *args)
    return writer.fields("chatcmpl-entries", Context().model_dump_json(exclude={"state"}).encode())


def test_a_chunk_is_written_as_its_hookdata_is() -> None:
    for held in (False, True):
        chunks = stream(held)
        assert entry(chunks, from_chunk=True) == entry(chunks, from_chunk=False)


def test_chunks_written_from_the_chunk_read_back_whole() -> None:
    chunks = stream(held=True)
    seen = decode(entry(chunks, from_chunk=True), ObservationBatch).seen()
    assert [stage.data.model_dump() for _, stage in seen] == [c.data().model_dump() for c in chunks]
    assert [stage.state for _, stage in seen] == [{"n": 1}] * len(chunks)
    assert [keys for keys, _ in seen] == [["audit.watch"]] * len(chunks)


def test_a_null_state_or_grow_is_left_out_and_read_as_written_out() -> None:
    """An unchanged state and a whole full_content are left out of a stage (null, their
    default), which readers of entries written with them spelt out read the same."""
    chunks = stream(held=False)
    fields = entry(chunks, from_chunk=True)
    stages = json.loads(fields[b"e"])["stages"]
    assert ["state" in s for s in stages] == [True] + [False] * (len(chunks) - 1)
    assert ["grow" in s for s in stages] == [False, True, True, True, False]
    spelt = dict(fields)
    envelope = json.loads(fields[b"e"])
    envelope["stages"] = [{"state": None, "grow": None, **s} for s in stages]
    spelt[b"e"] = json.dumps(envelope).encode()
    read = [(keys, stage.data.model_dump(), stage.state) for keys, stage in decode(fields, ObservationBatch).seen()]
    assert [(keys, stage.data.model_dump(), stage.state)
            for keys, stage in decode(spelt, ObservationBatch).seen()] == read
