"""Which chunks of a batched on_chunk hop the hooks changed (bus/chunk_batch.py ChangeCheck):
exact whether the batch's bytes can be followed chunk by chunk or not."""

from __future__ import annotations

import dataclasses
import json

import pytest
from openai.types.chat import ChatCompletionChunk

from hookbus.bus.wire.chunk_batch import ChangeCheck, ChunkIn, HeldText, dump_chunks, load_chunks
from hookbus.skills import HookData
from tests.streamed import chunks_in


def _chunk(i: int) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate({
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"content": f"c{i}"}, "finish_reason": None}],
    })


def _batch(n: int) -> list[ChunkIn]:
    return chunks_in([(_chunk(i), f"c{i}") for i in range(n)])


def _dump_v10(batch: list[ChunkIn]) -> bytes:
    """A batch as protocol 1.0 writes it: the text so far on its first chunk."""
    return dump_chunks(batch, kept=False)


def _run(raw: bytes, edit: dict[int, object]) -> list[bytes | None]:
    """What ChangeCheck says of each chunk of `raw` when `edit[i](chunk)` runs as its hooks."""
    check = ChangeCheck(raw)
    results = []
    for index, chunk in enumerate(load_chunks(raw)):
        check.before(chunk)
        returned = edit[index](chunk) if index in edit else None  # type: ignore[operator]
        results.append(check.after(returned if returned is not None else chunk))
    return results


def _blank(chunk: HookData) -> None:
    chunk.content = ""


def _other_text_so_far(chunk: HookData) -> HookData:
    return chunk.model_copy(update={"full_content": "not what the model said"})


@pytest.mark.parametrize("layout", ["as dumped", "spaced"])
def test_only_the_chunks_the_hooks_changed_come_back(layout):
    raw = _dump_v10(_batch(5))
    if layout == "spaced":  # another writer's JSON: the check cannot follow the bytes, dumps instead
        raw = json.dumps(json.loads(raw), indent=1).encode()
    results = _run(raw, {1: _other_text_so_far, 3: _blank})
    assert [r is not None for r in results][1:] == [True, False, True, False]
    if layout == "spaced":  # bytes it cannot follow: the first chunk may come back, unchanged
        assert results[0] is None or HookData.model_validate_json(results[0]) == _batch(1)[0].data()
    else:
        assert results[0] is None
    changed = HookData.model_validate_json(results[1])  # type: ignore[arg-type]
    assert changed.full_content == "not what the model said" and changed.content == "c1"
    assert HookData.model_validate_json(results[3]).content == ""  # type: ignore[arg-type]


def test_a_change_to_the_first_chunk_is_seen_and_the_rest_still_checked():
    results = _run(_dump_v10(_batch(3)), {0: _blank, 2: _blank})
    assert [r is not None for r in results] == [True, False, True]
    assert HookData.model_validate_json(results[0]).full_content == "c0"  # type: ignore[arg-type]
    assert HookData.model_validate_json(results[2]).full_content == "c0c1c2"  # type: ignore[arg-type]


def test_a_batch_the_hooks_left_alone_comes_back_all_unchanged():
    assert _run(_dump_v10(_batch(4)), {}) == [None, None, None, None]


def test_a_chunk_travels_without_its_defaults_and_loads_back_whole():
    batch = _batch(3)
    raw = dump_chunks(batch, kept=False)
    assert b"null" not in raw and b"tool_skipped" not in raw  # nor the stage's other fields
    assert raw.count(b"full_content") == 1
    loaded = load_chunks(raw)
    assert loaded == [c.data() for c in batch]  # every default back, every text so far rebuilt
    assert loaded[1].chunk is not None and loaded[1].chunk.choices[0].finish_reason is None


def test_an_edit_that_sets_a_default_back_is_a_change_still():
    def clear(chunk: HookData) -> None:
        chunk.content = None

    results = _run(_dump_v10(_batch(2)), {1: clear})
    assert results[0] is None and results[1] is not None
    assert HookData.model_validate_json(results[1]).content is None


def test_chunks_as_a_real_server_streams_them_travel_unchanged():
    """llama.cpp's shape: explicit nulls, a role-only first chunk, fields of its own
    (`timings`), a last chunk with the finish reason and usage."""
    base = {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1, "model": "gemma", "system_fingerprint": "b6", "usage": None}
    raw_chunks = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None, "logprobs": None}]},
        {**base, "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}], "timings": {"predicted_ms": 1.5}},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
         "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}},
    ]
    chunks = [ChatCompletionChunk.model_validate(c) for c in raw_chunks]
    texts = ["", "Hi", ""]
    batch = chunks_in(list(zip(chunks, texts, strict=True)))
    raw = dump_chunks(batch, kept=False)
    assert b'"timings":{"predicted_ms":1.5}' in raw
    assert load_chunks(raw) == [c.data() for c in batch]
    assert _run(raw, {}) == [None, None, None]


def test_the_held_text_follows_the_batch_and_only_a_rewrite_of_it_comes_back():
    """The first chunk brings the orchestrator's held text; each later chunk's hooks see it
    with the earlier chunks' text after it (as their hooks left them); a chunk whose hooks
    left `held` alone comes back unchanged (null)."""
    batch = _batch(4)
    batch[0] = dataclasses.replace(batch[0], held="ab")
    raw = dump_chunks(batch, kept=False)
    check, held = ChangeCheck(raw), HeldText()
    seen, results = [], []
    for chunk in load_chunks(raw):
        check.before(chunk)
        held.give(chunk)
        seen.append(chunk.held)
        if chunk.chunk_index == 1:
            chunk.content = "C1"
        if chunk.chunk_index == 2:
            chunk.held = chunk.held.replace("bc0C1", "[filtered]")  # type: ignore[union-attr]
        held.took(chunk)
        results.append(check.after(chunk))
    assert seen == ["ab", "abc0", "abc0C1", "a[filtered]c2"]
    assert [r is not None for r in results] == [False, True, True, False]
    assert HookData.model_validate_json(results[1]).held is None  # type: ignore[arg-type]
    assert HookData.model_validate_json(results[2]).held == "a[filtered]"  # type: ignore[arg-type]


def test_a_batch_without_a_window_carries_no_held_text():
    raw = _dump_v10(_batch(2))
    assert b"held" not in raw
    held = HeldText()
    for chunk in load_chunks(raw):
        held.give(chunk)
        assert chunk.held is None
        held.took(chunk)
