"""The hold-back window: streamed text reaches the client only once the on_chunk hooks
judged the text that follows it.

An on_chunk hook judges a chunk with what came before it (`data.full_content`), never
with what comes after. A banned phrase split over chunks (`" top"` + `" secret"`) is only
recognisable at its last piece, when the first pieces would already be on the client's
screen. A hook that declares `@hook("on_chunk", hold_back=N)` asks for a window: of the
text that passed the on_chunk hooks, the last N characters are held here, in the
orchestrator, before anything is written to the response stream. When the next chunks
pass the hooks, the text that falls out of the window goes out (a chunk is split where
the window starts, its copy carrying the released part). When a hook aborts the run
(HookError), the held text is dropped with the stream: the client never receives a byte
of what the hook rejected. When the LLM call ends, everything held goes out.

The window is the widest that any applicable on_chunk hook asked for
(`HookPlan.hold_back`); chunks without text (role, tool-call deltas, the finish) keep
their place in the order, held behind the text before them. The cost is the time to
first text: the client's first characters wait until N more have come from the model.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import AsyncGenerator

from openai.types.chat import ChatCompletionChunk

from hookbus.services.orchestrator.chunk_pipeline import chunk_text


class HoldBack:
    """The held chunks of one LLM call and the number of characters of text they hold."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"a hold-back window holds at least 1 character, not {window}")
        self.window = window
        self._held: collections.deque[ChatCompletionChunk] = collections.deque()
        self._chars = 0

    def take(self, chunk: ChatCompletionChunk) -> list[ChatCompletionChunk]:
        """`chunk` passed the hooks: hold it; returns what leaves the window now, in order."""
        self._held.append(chunk)
        self._chars += len(chunk_text(chunk))
        released: list[ChatCompletionChunk] = []
        excess = self._chars - self.window
        while self._held and excess >= 0:
            first = self._held[0]
            text = chunk_text(first)
            if len(text) <= excess:
                released.append(self._held.popleft())
                self._chars -= len(text)
                excess -= len(text)
                continue
            if excess:  # the window starts inside this chunk: its head goes, its tail stays
                head = first.model_copy(deep=True)
                head.choices[0].delta.content = text[:excess]
                head.choices[0].finish_reason = None
                first.choices[0].delta.content = text[excess:]
                released.append(head)
                self._chars -= excess
            break
        return released

    def rest(self) -> list[ChatCompletionChunk]:
        """The stream ended normally: everything held goes out."""
        released = list(self._held)
        self._held.clear()
        self._chars = 0
        return released


async def held_back(
    chunks: AsyncGenerator[ChatCompletionChunk, None], window: int
) -> AsyncGenerator[ChatCompletionChunk, None]:
    """`chunks` (one LLM call's, after on_chunk) with the last `window` characters held
    back until the chunks after them passed the hooks; an exception drops what is held."""
    hold = HoldBack(window)
    async with contextlib.aclosing(chunks) as judged:
        async for chunk in judged:
            for released in hold.take(chunk):
                yield released
    for released in hold.rest():
        yield released
