"""A streamed LLM call's chunks through `on_chunk`, in the model's order, batched.

Every chunk goes through the on_chunk hooks before the client sees it. When the stage is
one remote segment (its hooks all in one worker group), the chunks are batched
adaptively: a task reads the model's stream while the hooks work, and each hop carries
every chunk that arrived while the previous hop was in flight (up to `batch`; the first
hop leaves as soon as the first chunk is there, with whatever came with it). The worker runs the chain over the batch's chunks one after
another, so each hook sees the state the previous chunk left: the same calls, in the
same order, with the same data as one hop per chunk, only fewer hops. Nothing is
speculative. A HookError on a chunk ends the stream there: the chunks before it reach
the client, the rest are dropped. In-process hooks, or a chain over several segments
(whose hooks of different places would interleave per chunk), run one chunk at a time.

What passed the hooks goes through the hold-back window (hookbus.services.orchestrator.streaming.hold_back)
before the client and the call's assembled completion see it: with a window, the hooks
see the held text (`data.held`) and may rewrite it. A batch is held whole before it is
released, so a chunk's hooks in the worker see the window and the batch's earlier chunks
as held, which is what is held here when their rewrite is applied.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from openai.types.chat import ChatCompletionChunk

from hookbus.bus.wire.chunk_batch import ChunkIn, chunk_text
from hookbus.bus.wire.stream_text import StreamText
from hookbus.services.orchestrator.loop.request_state import RequestState
from hookbus.services.orchestrator.streaming.assemble import ChunkAssembler
from hookbus.services.orchestrator.streaming.hold_back import HoldBack
from hookbus.skills import HookbusError
from hookbus.skills.lifecycle import Lifecycle


@dataclass(frozen=True, slots=True)
class Judged:
    """One chunk after the on_chunk hooks."""

    chunk: ChatCompletionChunk | None
    """What the client gets of it (None: a hook dropped it)."""
    held: str | None = None
    """The held text as the hooks left it (None: no window, or not given back)."""


OnChunk = Callable[[RequestState, ChunkIn], Awaitable[Judged]]
"""Runs one chunk through the on_chunk stage."""


OnChunks = Callable[[RequestState, Sequence[ChunkIn]], Awaitable[tuple[list[Judged], HookbusError | None]]]
"""Runs several chunks through a one-segment remote on_chunk stage in one hop: the
result of each chunk before the HookError that stopped the chain, and that error."""


async def stream_chunks(
    state: RequestState,
    source: AsyncGenerator[ChatCompletionChunk, None],
    model: str,
    on_chunk: OnChunk,
    on_chunks: OnChunks,
    batch: int,
) -> AsyncGenerator[ChatCompletionChunk, None]:
    """The chunks of `source` (one LLM stream) as the client sees them; sets
    `state.last_response` to the assembled completion at the end."""
    segments = state.plan.segments(Lifecycle.ON_CHUNK, state.ctx.auth.scopes)
    assembly = _Assembly(state.completion_id, model, state.plan.hold_back(state.ctx.auth.scopes), state.chunks_seen)
    if batch > 1 and len(segments) == 1 and segments[0].group is not None:
        chunks = _batched(state, source, assembly, on_chunks, batch)
    else:
        observed = bool(state.plan.observers(Lifecycle.ON_CHUNK, state.ctx.auth.scopes))
        chunks = _sequential(state, source, assembly, on_chunk if segments or observed else None)
    async with contextlib.aclosing(chunks) as visible_chunks:
        async for chunk in visible_chunks:
            yield chunk


class _Assembly:
    """The model's chunks as they come in (text so far, kept once: a chunk refers to it),
    through the hold-back window, and the client's as they go out (assembled into the
    call's completion); both paths of this module share it."""

    def __init__(self, completion_id: str, model: str, window: int, first_index: int) -> None:
        self.completion_id = completion_id
        self.assembler = ChunkAssembler(completion_id, model)
        self.text = StreamText(first_index)
        self._hold = HoldBack(window)

    def held(self) -> str | None:
        """The held text a hook sees (None without a window)."""
        return self._hold.text() if self._hold.window else None

    def take_in(self, chunk: ChatCompletionChunk, index: int, held: str | None = None) -> ChunkIn:
        """A chunk from the model, as the on_chunk stage gets it (`index`: its chunk_index)."""
        chunk.id = self.completion_id
        if chunk.usage is not None:
            self.assembler.usage = chunk.usage
        content = chunk_text(chunk)
        return ChunkIn(chunk, content, index, self.text, self.text.add(content), held)

    def take_judged(self, judged: Judged, source: ChatCompletionChunk) -> None:
        """The hooks' result of the model's chunk `source`: a rewrite of the held text is
        applied, then the chunk waits in the window (unless a hook dropped it, or it is the
        usage-only chunk, summed at the end)."""
        if self._hold.window and judged.held is not None and judged.held != self._hold.text():
            self._hold.replace(judged.held, source)
        visible = judged.chunk
        if visible is not None and visible.choices:
            visible.id = self.completion_id
            self._hold.hold(visible)

    def send_out(self, final: bool = False) -> list[ChatCompletionChunk]:
        """What leaves the window now (all of it when the stream ended: `final`), each
        part of the completion."""
        released = self._hold.rest() if final else self._hold.release()
        for chunk in released:
            self.assembler.add(chunk)
        return released


async def _sequential(
    state: RequestState,
    source: AsyncGenerator[ChatCompletionChunk, None],
    assembly: _Assembly,
    on_chunk: OnChunk | None,
) -> AsyncGenerator[ChatCompletionChunk, None]:
    async with contextlib.aclosing(source) as stream:
        async for chunk in stream:
            given = assembly.take_in(chunk, state.chunks_seen, assembly.held())
            judged = Judged(chunk) if on_chunk is None else await on_chunk(state, given)
            state.chunks_seen += 1
            assembly.take_judged(judged, chunk)
            for visible in assembly.send_out():
                yield visible
    for visible in assembly.send_out(final=True):
        yield visible
    state.last_response = assembly.assembler.completion()


async def _batched(
    state: RequestState,
    source: AsyncGenerator[ChatCompletionChunk, None],
    assembly: _Assembly,
    on_chunks: OnChunks,
    batch: int,
) -> AsyncGenerator[ChatCompletionChunk, None]:
    """A reader task takes the model's chunks as they come (holding at most `2 * batch`
    unsent); this generator sends what has gathered, one hop at a time (the first chunk
    with the held text), and yields the results in order."""
    waiting: collections.deque[ChunkIn] = collections.deque()
    arrived, room = asyncio.Event(), asyncio.Event()
    finished = False
    failure: BaseException | None = None

    async def read() -> None:
        nonlocal finished, failure
        try:
            async with contextlib.aclosing(source) as stream:
                async for chunk in stream:
                    waiting.append(assembly.take_in(chunk, state.chunks_seen))
                    state.chunks_seen += 1
                    arrived.set()
                    await asyncio.sleep(0)  # chunks the client buffered come one by one: a waiting hop leaves at once
                    while len(waiting) >= 2 * batch:
                        room.clear()
                        await room.wait()
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, raised there
            failure = exc
        finally:
            finished = True
            arrived.set()

    reader = asyncio.ensure_future(read())
    try:
        while True:
            if not waiting:
                if finished:
                    break
                arrived.clear()
                await arrived.wait()
                continue
            taken = [waiting.popleft() for _ in range(min(batch, len(waiting)))]
            taken[0] = dataclasses.replace(taken[0], held=assembly.held())
            room.set()
            results, abort = await on_chunks(state, taken)
            for judged, given in zip(results, taken, strict=False):  # those before a HookError
                assembly.take_judged(judged, given.chunk)
            for visible in assembly.send_out():
                yield visible
            if abort is not None:
                raise abort  # what is held is dropped with it
        if failure is not None:
            raise failure
        for visible in assembly.send_out(final=True):
            yield visible
    finally:
        if not reader.done():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
    state.last_response = assembly.assembler.completion()
