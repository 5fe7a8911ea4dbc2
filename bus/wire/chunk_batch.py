"""The data of a batched on_chunk hop (format: hookbus.bus.wire.envelopes): chunks in, results out.

Both sides of the hop use these, so the array layout and the rebuilt `full_content` are
written once. From protocol 1.1 a batch carries no text so far: each side keeps it
(hookbus.bus.wire.stream_text), and a chunk's `content` is left out when it is the
chunk's own text. A chunk travels as its HookData without the fields at their defaults (the
stage's other fields, a chunk's unset `null`s): the worker's validation puts them back,
equal, and the worker dumps what it checks the same way, so an unchanged chunk is still
recognised by its bytes. That is a third of the bytes of a full dump, and the orchestrator
writes the batch from the model's chunks in one call instead of building a HookData per
chunk (tests/bench/RESULTS.md, "Why the hop path is built as it is").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NotRequired

from openai.types.chat import ChatCompletionChunk
from pydantic import TypeAdapter
from typing_extensions import TypedDict

from hookbus.bus.wire.stream_text import StreamText
from hookbus.skills.data import HookData
from hookbus.skills.lifecycle import Lifecycle


def chunk_text(chunk: ChatCompletionChunk | None) -> str:
    """This chunk's text ("" for role-only, tool-call, finish and usage chunks)."""
    if chunk is not None and chunk.choices and chunk.choices[0].delta.content:
        return chunk.choices[0].delta.content
    return ""


@dataclass(frozen=True, slots=True)
class ChunkIn:
    """One chunk from the model, as the on_chunk stage gets it."""

    chunk: ChatCompletionChunk
    content: str
    index: int
    text: StreamText
    """The model's text of this call, kept once for all its chunks."""
    count: int
    """How many chunks of the call the text so far holds with this one."""
    held: str | None = None
    """The text held back from the client before this chunk (None: no hold-back window).
    A batch carries it on its first chunk only; the worker follows it through the batch
    (`HeldText`)."""

    @property
    def full(self) -> str:
        """The model's text so far, this chunk's included (joined when asked)."""
        return self.text.upto(self.count)

    def data(self) -> HookData:
        """This chunk as the on_chunk stage's data."""
        return HookData.model_construct(
            lifecycle=Lifecycle.ON_CHUNK, chunk=self.chunk, content=self.content, chunk_index=self.index,
            full_content=self.full, held=self.held,
        )


class ChunkWire(TypedDict):
    """A chunk's HookData on the wire: its on_chunk fields, in HookData's field order."""

    lifecycle: str
    chunk: ChatCompletionChunk
    content: NotRequired[str]
    chunk_index: int
    full_content: NotRequired[str]
    held: NotRequired[str]


CHUNK_WIRE: TypeAdapter[ChunkWire] = TypeAdapter(ChunkWire)
"""One chunk's HookData as JSON, written from the chunk without building the HookData
(dumped with `exclude_defaults`, the same bytes as the HookData's dump)."""
CHUNK_BATCH: TypeAdapter[list[ChunkWire]] = TypeAdapter(list[ChunkWire])
"""The `d` field of a batched on_chunk hop (its JSON Schema is the protocol's ChunkBatch)."""
_CHUNKS: TypeAdapter[list[HookData]] = TypeAdapter(list[HookData])
CHUNK_RESULTS: TypeAdapter[list[HookData | None]] = TypeAdapter(list[HookData | None])
"""The `d` field of the reply to a batched on_chunk hop (the protocol's ChunkResults)."""
_SKIP_FULL = {"full_content"}
_SKIP_TEXT = {"full_content", "content"}


def dump_chunks(chunks: Sequence[ChunkIn], *, kept: bool) -> bytes:
    """The `d` field of a batch; `held` (with a window) only on the first chunk. Protocol
    1.0 (`kept` False): every chunk with its `content`, the first with its `full_content`.
    1.1 (`kept`, the worker keeps the stream's text): no `full_content`, and a chunk's
    `content` left out when it is the chunk's own text (the worker takes it from the
    chunk: a stream's text then travels once)."""
    items: list[ChunkWire] = [
        {"lifecycle": "on_chunk", "chunk": c.chunk, "chunk_index": c.index}
        if kept and c.content == chunk_text(c.chunk)
        else {"lifecycle": "on_chunk", "chunk": c.chunk, "content": c.content, "chunk_index": c.index}
        for c in chunks
    ]
    if not kept:
        items[0]["full_content"] = chunks[0].full
    if chunks[0].held is not None:
        items[0]["held"] = chunks[0].held
    return CHUNK_BATCH.dump_json(items, exclude_defaults=True)


def _dump(data: HookData, *, full: bool = True, kept: bool = False) -> bytes:
    """A chunk's HookData as `dump_chunks` writes it (`full`: with its `full_content`;
    `kept`: as protocol 1.1 writes it, never with its `full_content`)."""
    if kept:
        skip = _SKIP_TEXT if data.content == chunk_text(data.chunk) else _SKIP_FULL
        return data.model_dump_json(exclude_defaults=True, exclude=skip).encode()
    return data.model_dump_json(exclude_defaults=True, exclude=None if full else _SKIP_FULL).encode()


def load_chunks(raw: bytes) -> list[HookData]:
    """The chunks of a protocol 1.0 batch with every `full_content` rebuilt (the model's
    text so far)."""
    chunks = _load(raw)
    full = chunks[0].full_content or ""
    for chunk in chunks[1:]:
        full += chunk.content or ""
        chunk.set_internal(full_content=full)
    return chunks


def load_kept_chunks(raw: bytes) -> list[HookData]:
    """The chunks of a protocol 1.1 batch, each `content` put back; `full_content` is the
    worker's to set from the text it keeps (hookbus.bus.wire.stream_text)."""
    chunks = _load(raw)
    _put_back_content(chunks)
    return chunks


def _load(raw: bytes) -> list[HookData]:
    chunks = _CHUNKS.validate_json(raw)
    if not chunks:
        raise ValueError("a batched on_chunk hop without chunks")
    return chunks


class HeldText:
    """The held text through one batch, on the worker's side: the first chunk brings what
    the orchestrator holds; each later chunk's hooks see that, as the earlier chunks' hooks
    left it, followed by those chunks' text (the orchestrator releases nothing of a batch
    before its reply, so that is what it holds when it applies a rewrite). A later chunk's
    `held` goes back only when its hooks changed it (else `ChangeCheck` would see every
    chunk changed). Inactive when the batch has no window (no `held` on its first chunk)."""

    def __init__(self) -> None:
        self._text: str | None = None
        self._first = True

    def give(self, chunk: HookData) -> None:
        """Before the chunk's hooks run (after `ChangeCheck.before`)."""
        if self._first:
            self._text = chunk.held
        elif self._text is not None:
            chunk.set_internal(held=self._text)

    def took(self, data: HookData) -> None:
        """After the chunk's hooks ran (before `ChangeCheck.after`)."""
        first, self._first = self._first, False
        if self._text is None:
            return
        held = self._text if data.held is None else data.held
        if not first and held == self._text:
            data.set_internal(held=None)
        shown = data.chunk is not None and bool(data.chunk.choices)
        self._text = held + (data.content or "" if shown else "")


class ChangeCheck:
    """Tells, chunk by chunk, whether the hooks changed the chunks of one batch (`raw`, as
    `dump_chunks` wrote it), with one dump per unchanged chunk instead of two.

    A chunk is unchanged when it dumps to the very bytes the orchestrator sent for it (and,
    protocol 1.0, keeps the `full_content` it was given), so no dump of it is needed before
    its hooks run. That needs to know where its JSON starts in `raw`: known up to the first
    chunk that differs, after which each chunk is dumped before its hooks and after them,
    and the two dumps are compared. Either
    way an edit in place is seen (it changes the dump); a chunk reported changed that is
    equal after all (another build's dump differs) costs bytes, never correctness. `kept`
    (protocol 1.1): a result never carries `full_content`, nor `content` when it is the
    chunk's own text."""

    def __init__(self, raw: bytes, *, kept: bool = False) -> None:
        self._raw = raw
        self._kept = kept
        self._offset: int | None = 1
        """Where the next chunk's JSON starts in `raw`, while known (just past the `[`)."""
        self._first = True
        self._before: bytes | None = None
        self._full: str | None = None

    def before(self, chunk: HookData) -> None:
        """Call with each chunk in turn, before its hooks run; `after` once they ran."""
        if not self._kept:  # 1.1 keeps no reference: the worker extends the text in place
            self._full = chunk.full_content
        if self._offset is None:
            self._before = _dump(chunk, kept=self._kept)

    def after(self, data: HookData) -> bytes | None:
        """The chunk's HookData JSON once its hooks ran (`data`), or None when unchanged."""
        first, self._first = self._first, False
        if self._offset is None:
            dumped = _dump(data, kept=self._kept)
            return dumped if dumped != self._before else None
        sent = _dump(data, full=first, kept=self._kept)
        end = self._offset + len(sent)
        if self._raw.startswith(sent, self._offset) and self._raw[end : end + 1] in (b",", b"]") and (
            first or self._kept or data.full_content == self._full
        ):
            self._offset = end + 1
            return None
        self._offset = None
        return sent if first or self._kept else _dump(data)


def dump_results(results: Sequence[bytes | None]) -> bytes:
    """The reply's `d`: each processed chunk's changed HookData JSON, or null."""
    return b"[" + b",".join(r if r is not None else b"null" for r in results) + b"]"


def load_results(raw: bytes, *, kept: bool) -> list[HookData | None]:
    """The reply's `d` (`kept`: a protocol 1.1 batch's, each `content` put back)."""
    results = CHUNK_RESULTS.validate_json(raw)
    if kept:
        _put_back_content(results)
    return results


def _put_back_content(chunks: Sequence[HookData | None]) -> None:
    """A protocol 1.1 chunk without `content` has its chunk's text as its content."""
    for chunk in chunks:
        if chunk is not None and chunk.content is None:
            chunk.set_internal(content=chunk_text(chunk.chunk))
