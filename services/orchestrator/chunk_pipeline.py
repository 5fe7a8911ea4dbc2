"""A streamed LLM call's chunks through `on_chunk`, in the model's order, optionally pipelined.

Every chunk goes through the on_chunk hooks before the client sees it. When every on_chunk
segment is remote (a worker group) and the agent's `chunk_window` is above 1, the chunks
are pipelined: chunk i+1 is sent to the hooks before chunk i's reply is back (up to
`chunk_window` chunks of this request in flight), and the client still gets the results
strictly in the model's order. Each chunk's hooks run on a snapshot of `ctx.state` /
`ctx.session.data` taken when it was sent, so the pipeline is only kept while on_chunk
hooks leave them unchanged: the first reply that changes them is applied, the chunks sent
after it (which saw the old state) are sent again, one at a time, and the rest of the call
runs sequentially as with in-process hooks. The first chunk always goes alone, so hooks
that keep per-request state on every chunk (the built-in ContentFilter, Analytics) are
detected on chunk 0 and run strictly sequentially from the start. The catch: a hook that
starts writing `ctx.state` only at a later chunk may already have been called for up to
`chunk_window - 1` following chunks with the older state; those calls are discarded and
made again, so such a hook's side effects outside `ctx` can happen twice for them. A
HookError on chunk i ends the stream at chunk i (the results of later chunks already sent
are dropped). In-process on_chunk hooks (or a chain mixing both) are always called one
chunk at a time.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from openai.types.chat import ChatCompletionChunk

from hookbus.services.orchestrator.assemble import ChunkAssembler
from hookbus.services.orchestrator.run_state import RunState
from hookbus.skills import Context

OnChunk = Callable[[RunState, ChatCompletionChunk, str, int, str], Awaitable[ChatCompletionChunk | None]]
"""Runs one chunk through the on_chunk stage: (state, chunk, content, index, full_content)."""


@dataclass
class _ChunkHop:
    """One pipelined on_chunk hop: its inputs, the state it was sent with, its future."""

    chunk: ChatCompletionChunk
    content: str
    index: int
    full: str
    state: dict[str, Any]
    session: dict[str, Any]
    future: asyncio.Future[ChatCompletionChunk | None] | None = None
    ctx: Context | None = None


async def stream_chunks(
    state: RunState,
    source: AsyncGenerator[ChatCompletionChunk, None],
    model: str,
    on_chunk: OnChunk,
    chunk_window: int,
) -> AsyncGenerator[ChatCompletionChunk, None]:
    """The chunks of `source` (one LLM stream) as the client sees them; sets
    `state.last_response` to the assembled completion at the end."""
    segments = state.plan.segments("on_chunk", state.ctx.auth.scopes)
    if segments and chunk_window > 1 and all(s.group is not None for s in segments):
        chunks = _pipelined(state, source, model, on_chunk, chunk_window)
    else:
        chunks = _sequential(state, source, model, on_chunk if segments else None)
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


async def _pipelined(
    state: RunState,
    source: AsyncGenerator[ChatCompletionChunk, None],
    model: str,
    on_chunk: OnChunk,
    window: int,
) -> AsyncGenerator[ChatCompletionChunk, None]:
    """A producer task reads the model's stream and sends each chunk's hop at once (up to
    `window` unsettled); this generator settles them in order and yields each as soon as
    it and every earlier one is back."""
    assembly = _Assembly(state.completion_id, model)
    ctx = state.ctx
    pending: collections.deque[_ChunkHop] = collections.deque()
    wake, room, first_settled = asyncio.Event(), asyncio.Event(), asyncio.Event()
    sequential = False
    finished = False
    failure: BaseException | None = None

    def send(chunk: ChatCompletionChunk, content: str, index: int, full: str) -> _ChunkHop:
        hop = _ChunkHop(chunk, content, index, full, ctx.state, ctx.session.data)
        if not sequential:
            # the hop's own Context: its reply rebinds this copy's state/session, not ctx's
            own = ctx.model_copy(update={"session": ctx.session.model_copy()})
            hop.ctx = own
            hop.future = asyncio.ensure_future(
                on_chunk(dataclasses.replace(state, ctx=own), chunk, content, index, full)
            )
        return hop

    async def produce() -> None:
        nonlocal finished, failure
        try:
            async with contextlib.aclosing(source) as stream:
                async for chunk in stream:
                    content, full = assembly.take_in(chunk)
                    index = state.chunks_seen
                    state.chunks_seen += 1
                    pending.append(send(chunk, content, index, full))
                    wake.set()
                    if index == 0:  # the first chunk goes alone: it tells whether hooks keep state
                        await first_settled.wait()
                    while len(pending) >= window:
                        room.clear()
                        await room.wait()
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, raised there
            failure = exc
        finally:
            finished = True
            wake.set()

    async def settle(hop: _ChunkHop) -> ChatCompletionChunk | None:
        """Chunk `hop`'s result, in order; sent again alone if it ran on an old state."""
        nonlocal sequential
        if hop.future is None or hop.ctx is None:
            return await on_chunk(state, hop.chunk, hop.content, hop.index, hop.full)
        if hop.state is not ctx.state or hop.session is not ctx.session.data:
            hop.future.cancel()
            return await on_chunk(state, hop.chunk, hop.content, hop.index, hop.full)
        visible = await hop.future
        own = hop.ctx
        if own.state != ctx.state or own.session.data != ctx.session.data:
            ctx.state = own.state
            ctx.session.data = own.session.data
            sequential = True  # hooks keep state: no more speculation in this call
        return visible

    producer = asyncio.ensure_future(produce())
    try:
        while True:
            if not pending:
                if finished:
                    break
                wake.clear()
                await wake.wait()
                continue
            hop = pending.popleft()
            room.set()
            try:
                visible = await settle(hop)
            finally:
                if hop.index == 0:
                    first_settled.set()
            if assembly.send_out(visible):
                assert visible is not None
                yield visible
        if failure is not None:
            raise failure
    finally:
        if not producer.done():
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await producer
        for hop in pending:
            if hop.future is not None:
                hop.future.cancel()
    state.last_response = assembly.assembler.completion()


def chunk_text(chunk: ChatCompletionChunk) -> str:
    """This chunk's text ("" for role-only, tool-call, finish and usage chunks)."""
    if chunk.choices and chunk.choices[0].delta.content:
        return chunk.choices[0].delta.content
    return ""
