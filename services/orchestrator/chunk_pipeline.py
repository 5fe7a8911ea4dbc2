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
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence

from openai.types.chat import ChatCompletionChunk

from hookbus.bus.wire.chunk_batch import ChunkIn
from hookbus.services.orchestrator.assemble import ChunkAssembler
from hookbus.services.orchestrator.run_state import RunState
from hookbus.skills import HookbusError
from hookbus.skills.lifecycle import Lifecycle

OnChunk = Callable[[RunState, ChatCompletionChunk, str, int, str], Awaitable[ChatCompletionChunk | None]]
"""Runs one chunk through the on_chunk stage: (state, chunk, content, index, full_content)."""


OnChunks = Callable[
    [RunState, Sequence[ChunkIn]], Awaitable[tuple[list[ChatCompletionChunk | None], HookbusError | None]]
]
"""Runs several chunks through a one-segment remote on_chunk stage in one hop: the
visible result of each chunk before the HookError that stopped the chain, and that error."""


async def stream_chunks(
    state: RunState,
    source: AsyncGenerator[ChatCompletionChunk, None],
    model: str,
    on_chunk: OnChunk,
    on_chunks: OnChunks,
    batch: int,
) -> AsyncGenerator[ChatCompletionChunk, None]:
    """The chunks of `source` (one LLM stream) as the client sees them; sets
    `state.last_response` to the assembled completion at the end."""
    segments = state.plan.segments(Lifecycle.ON_CHUNK, state.ctx.auth.scopes)
    if batch > 1 and len(segments) == 1 and segments[0].group is not None:
        chunks = _batched(state, source, model, on_chunks, batch)
    else:
        observed = bool(state.plan.observers(Lifecycle.ON_CHUNK, state.ctx.auth.scopes))
        chunks = _sequential(state, source, model, on_chunk if segments or observed else None)
    async with contextlib.aclosing(chunks) as visible_chunks:
        async for chunk in visible_chunks:
            yield chunk


class _Assembly:
    """The model's chunks as they come in (text so far) and the client's as they go out
    (assembled into the call's completion); both paths of this module share it."""

    def __init__(self, completion_id: str, model: str) -> None:
        self.completion_id = completion_id
        self.assembler = ChunkAssembler(completion_id, model)
        self._text: list[str] = []

    def take_in(self, chunk: ChatCompletionChunk) -> tuple[str, str]:
        """A chunk from the model: (its text, the model's text so far including it)."""
        chunk.id = self.completion_id
        if chunk.usage is not None:
            self.assembler.usage = chunk.usage
        content = chunk_text(chunk)
        if content:
            self._text.append(content)
        return content, "".join(self._text)

    def send_out(self, visible: ChatCompletionChunk | None) -> bool:
        """Whether the hooks' result goes to the client (then it is part of the completion)."""
        if visible is None or not visible.choices:
            return False  # dropped by a hook, or the usage-only chunk (summed at the end)
        visible.id = self.completion_id
        self.assembler.add(visible)
        return True


async def _sequential(
    state: RunState,
    source: AsyncGenerator[ChatCompletionChunk, None],
    model: str,
    on_chunk: OnChunk | None,
) -> AsyncGenerator[ChatCompletionChunk, None]:
    assembly = _Assembly(state.completion_id, model)
    async with contextlib.aclosing(source) as stream:
        async for chunk in stream:
            content, full = assembly.take_in(chunk)
            visible = chunk if on_chunk is None else await on_chunk(state, chunk, content, state.chunks_seen, full)
            state.chunks_seen += 1
            if assembly.send_out(visible):
                assert visible is not None
                yield visible
    state.last_response = assembly.assembler.completion()


async def _batched(
    state: RunState,
    source: AsyncGenerator[ChatCompletionChunk, None],
    model: str,
    on_chunks: OnChunks,
    batch: int,
) -> AsyncGenerator[ChatCompletionChunk, None]:
    """A reader task takes the model's chunks as they come (holding at most `2 * batch`
    unsent); this generator sends what has gathered, one hop at a time, and yields the
    results in order."""
    assembly = _Assembly(state.completion_id, model)
    waiting: collections.deque[ChunkIn] = collections.deque()
    arrived, room = asyncio.Event(), asyncio.Event()
    finished = False
    failure: BaseException | None = None

    async def read() -> None:
        nonlocal finished, failure
        try:
            async with contextlib.aclosing(source) as stream:
                async for chunk in stream:
                    content, full = assembly.take_in(chunk)
                    waiting.append(ChunkIn(chunk, content, state.chunks_seen, full))
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
            room.set()
            visible, abort = await on_chunks(state, taken)
            for shown in visible:
                if assembly.send_out(shown):
                    assert shown is not None
                    yield shown
            if abort is not None:
                raise abort
        if failure is not None:
            raise failure
    finally:
        if not reader.done():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
    state.last_response = assembly.assembler.completion()


def chunk_text(chunk: ChatCompletionChunk) -> str:
    """This chunk's text ("" for role-only, tool-call, finish and usage chunks)."""
    if chunk.choices and chunk.choices[0].delta.content:
        return chunk.choices[0].delta.content
    return ""
