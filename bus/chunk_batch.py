"""The data of a batched on_chunk hop (format: hookbus.bus.envelopes): chunks in, results out.

Both sides of the hop use these, so the array layout and the rebuilt `full_content` are
written once.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import TypeAdapter

from hookbus.skills.data import HookData

_CHUNKS: TypeAdapter[list[HookData]] = TypeAdapter(list[HookData])
_RESULTS: TypeAdapter[list[HookData | None]] = TypeAdapter(list[HookData | None])
_SKIP_FULL = {"full_content"}


def dump_chunks(chunks: Sequence[HookData]) -> bytes:
    """The `d` field of a batch: `full_content` only on the first chunk."""
    parts = [chunks[0].model_dump_json().encode()]
    parts.extend(c.model_dump_json(exclude=_SKIP_FULL).encode() for c in chunks[1:])
    return b"[" + b",".join(parts) + b"]"


def load_chunks(raw: bytes) -> list[HookData]:
    """The chunks of a batch with every `full_content` rebuilt (the model's text so far)."""
    chunks = _CHUNKS.validate_json(raw)
    if not chunks:
        raise ValueError("a batched on_chunk hop without chunks")
    full = chunks[0].full_content or ""
    for chunk in chunks[1:]:
        full += chunk.content or ""
        chunk.set_internal(full_content=full)
    return chunks


class ChangeCheck:
    """Tells, chunk by chunk, whether the hooks changed the chunks of one batch (`raw`, as
    `dump_chunks` wrote it), with one dump per unchanged chunk instead of two.

    A chunk is unchanged when it dumps to the very bytes the orchestrator sent for it and
    keeps the `full_content` it was given, so no dump of it is needed before its hooks
    run. That needs to know where its JSON starts in `raw`: known up to the first chunk
    that differs, after which each chunk is dumped before its hooks and after them, and
    the two dumps are compared. Either way an edit in place is seen (it changes the dump);
    a chunk reported changed that is equal after all (another build's dump differs) costs
    bytes, never correctness."""

    def __init__(self, raw: bytes) -> None:
        self._raw = raw
        self._offset: int | None = 1
        """Where the next chunk's JSON starts in `raw`, while known (just past the `[`)."""
        self._first = True
        self._before: bytes | None = None
        self._full: str | None = None

    def before(self, chunk: HookData) -> None:
        """Call with each chunk in turn, before its hooks run; `after` once they ran."""
        self._full = chunk.full_content
        if self._offset is None:
            self._before = chunk.model_dump_json().encode()

    def after(self, data: HookData) -> bytes | None:
        """The chunk's HookData JSON once its hooks ran (`data`), or None when unchanged."""
        first, self._first = self._first, False
        if self._offset is None:
            dumped = data.model_dump_json().encode()
            return dumped if dumped != self._before else None
        sent = data.model_dump_json(exclude=None if first else _SKIP_FULL).encode()
        end = self._offset + len(sent)
        if self._raw.startswith(sent, self._offset) and self._raw[end : end + 1] in (b",", b"]") and (
            first or data.full_content == self._full
        ):
            self._offset = end + 1
            return None
        self._offset = None
        return sent if first else data.model_dump_json().encode()


def dump_results(results: Sequence[bytes | None]) -> bytes:
    """The reply's `d`: each processed chunk's changed HookData JSON, or null."""
    return b"[" + b",".join(r if r is not None else b"null" for r in results) + b"]"


def load_results(raw: bytes) -> list[HookData | None]:
    return _RESULTS.validate_json(raw)
