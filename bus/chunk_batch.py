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


def dump_results(results: Sequence[bytes | None]) -> bytes:
    """The reply's `d`: each processed chunk's changed HookData JSON, or null."""
    return b"[" + b",".join(r if r is not None else b"null" for r in results) + b"]"


def load_results(raw: bytes) -> list[HookData | None]:
    return _RESULTS.validate_json(raw)
