"""The on_chunk stage of an LLM call: a streamed call's chunks, or a non-streamed answer
judged as one chunk by the hooks that hold text back.

The chunks' path (batching, the hold-back window, assembly) is hookbus.services.
orchestrator.streaming.chunk_pipeline's; this module runs the stage for it, one chunk
(`on_chunk`) or a batch in one hop (`on_chunks`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionChunk

from hookbus.bus.wire.chunk_batch import ChunkIn
from hookbus.services.observability import tracing
from hookbus.services.orchestrator.loop.host import LoopHost
from hookbus.services.orchestrator.loop.request_state import RequestState
from hookbus.services.orchestrator.loop.stage_runner import stage
from hookbus.services.orchestrator.streaming.chunk_pipeline import Judged, stream_chunks
from hookbus.services.orchestrator.streaming.hold_back import whole_answer_chunk
from hookbus.skills import HookbusError, HookData
from hookbus.skills.lifecycle import Lifecycle
from hookbus.skills.model_settings import ModelSettings


async def streamed_llm_call(
    host: LoopHost, state: RequestState, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
    settings: ModelSettings,
) -> AsyncGenerator[ChatCompletionChunk, None]:
    """One streamed LLM call; every chunk goes through on_chunk before the client sees it
    (batched when the stage is one remote segment and `chunk_batch` > 1), and through
    the hold-back window when an on_chunk hook asked for one
    (hookbus.services.orchestrator.streaming.hold_back)."""
    chunks = stream_chunks(
        state, host.llm.stream(host.model, messages, tools, settings), host.model,
        functools.partial(on_chunk, host), functools.partial(on_chunks, host), host.chunk_batch,
    )
    async with contextlib.aclosing(chunks) as visible:
        async for chunk in visible:
            yield chunk


async def guarded_answer(host: LoopHost, state: RequestState, answer: ChatCompletion) -> ChatCompletion:
    """A non-streamed answer judged by the on_chunk hooks that hold text back: a client
    that asked for no stream would otherwise get what those guards keep from a stream.
    The answer goes through them as a stream of one chunk holding all of it (their
    window is the whole text), so a refusal is the same error and a rewrite reaches
    the answer; the other on_chunk hooks and observers run for streams only, as they
    always did."""
    judging = dataclasses.replace(state, plan=state.plan.windowed())
    chunks = stream_chunks(
        judging, _as_stream(whole_answer_chunk(answer)), host.model,
        functools.partial(on_chunk, host), functools.partial(on_chunks, host), host.chunk_batch,
    )
    async with contextlib.aclosing(chunks) as judged:
        async for _ in judged:
            pass
    state.chunks_seen = judging.chunks_seen
    assert judging.last_response is not None
    return judging.last_response


async def on_chunk(host: LoopHost, state: RequestState, given: ChunkIn) -> Judged:
    scopes = state.ctx.auth.scopes
    if state.observations is not None and not state.plan.segments(Lifecycle.ON_CHUNK, scopes):
        # only observers: nothing runs on the chunk's path, they get the chunk as it came
        key = f"on_chunk#{given.index}"
        state.observations.record(state.plan.observers(Lifecycle.ON_CHUNK, scopes), given, key, time.time())
        return Judged(given.chunk, given.held)
    data = await stage(host, state, given.data(), f"on_chunk#{given.index}")
    return _judged(data, given.content)


async def on_chunks(
    host: LoopHost, state: RequestState, chunks: Sequence[ChunkIn]
) -> tuple[list[Judged], HookbusError | None]:
    """Several chunks through the one remote on_chunk segment in one hop."""
    (segment,) = state.plan.segments(Lifecycle.ON_CHUNK, state.ctx.auth.scopes)
    began = time.time()
    with tracing.stage_span(Lifecycle.ON_CHUNK, f"on_chunk#{chunks[0].index}"):
        started = time.perf_counter()
        result = await host.runtime.hop_chunks(segment, chunks, state.ctx)
        host.runtime.record_stage(
            state.completion_id, Lifecycle.ON_CHUNK, segment.group, result.outcomes,
            (time.perf_counter() - started) * 1000,
        )
    shown = result.data[:-1] if result.abort is not None else result.data
    observers = state.plan.observers(Lifecycle.ON_CHUNK, state.ctx.auth.scopes)
    if observers and state.observations is not None:
        for d, c in zip(shown, chunks, strict=False):
            if d is not None and d.full_content is None:  # a changed chunk comes back without it
                d.set_internal(full_content=c.full)
            state.observations.record(observers, c if d is None else d, f"on_chunk#{c.index}", began)
    return [
        Judged(c.chunk) if d is None else _judged(d, c.content) for d, c in zip(shown, chunks, strict=False)
    ], result.abort


def _judged(data: HookData, content: str) -> Judged:
    """The chunk the client gets after on_chunk (hooks that changed `content` change its
    text), and the held text as the hooks left it."""
    if data.chunk is not None and data.content != content and data.chunk.choices:
        data.chunk.choices[0].delta.content = data.content
    return Judged(data.chunk, data.held)


async def _as_stream(chunk: ChatCompletionChunk) -> AsyncGenerator[ChatCompletionChunk, None]:
    yield chunk
