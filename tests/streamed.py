"""Chunks of one model stream as the orchestrator takes them in, for tests of the on_chunk wire."""

from __future__ import annotations

from collections.abc import Sequence

from openai.types.chat import ChatCompletionChunk

from hookbus.bus.wire.chunk_batch import ChunkIn
from hookbus.bus.wire.stream_text import StreamText


def chunks_in(pieces: Sequence[tuple[ChatCompletionChunk, str]], start: int = 0) -> list[ChunkIn]:
    """One stream's chunks (chunk, its text), sharing its text so far as the orchestrator's
    do (hookbus.services.orchestrator.streaming.chunk_pipeline), the first at chunk_index `start`."""
    text = StreamText(start)
    return [ChunkIn(chunk, content, start + i, text, text.add(content)) for i, (chunk, content) in enumerate(pieces)]
