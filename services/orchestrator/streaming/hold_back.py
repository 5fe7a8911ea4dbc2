"""The hold-back window: streamed text reaches the client only once the on_chunk hooks
judged the text that follows it, and those hooks may rewrite what is still held.

An on_chunk hook judges a chunk with what came before it (`data.full_content`), never
with what comes after. A banned phrase split over chunks (`" top"` + `" secret"`) is only
recognisable at its last piece, when the first pieces would already be on the client's
screen. A hook that declares `@hook("on_chunk", hold_back=N)` asks for a window: of the
text that passed the on_chunk hooks, the last N characters are held here, in the
orchestrator, before anything is written to the response stream. The hooks see that text
as `data.held` and may replace it (a phrase split over chunks becomes "[filtered]").
When the next chunks pass the hooks, the text that falls out of the window goes out (a
chunk is split where the window starts, its copy carrying the released part). When a hook
aborts the run (HookError), the held text is dropped with the stream: the client never
receives a byte of what the hook rejected. When the LLM call ends, everything held goes out.

The window is the widest that any applicable on_chunk hook asked for
(`HookPlan.hold_back`); chunks without text (role, tool-call deltas, the finish) keep
their place in the order, held behind the text before them. A window of 0 holds nothing
(every chunk leaves at its `release`). The cost is the time to first text: the client's
first characters wait until N more have come from the model.
"""

from __future__ import annotations

import collections

from openai.types.chat import ChatCompletion, ChatCompletionChunk

from hookbus.bus.wire.chunk_batch import chunk_text
from hookbus.services.orchestrator.llm.answers import completion_chunks


class HoldBack:
    """The held chunks of one LLM call and the number of characters of text they hold.

    `hold` takes a chunk that passed the hooks, `release` lets out what lies beyond the
    window. The batched on_chunk path holds a whole batch before it releases, so the held
    text a hook saw in the worker (the window and the batch's earlier chunks) is the text
    held here when its rewrite is applied."""

    def __init__(self, window: int) -> None:
        if window < 0:
            raise ValueError(f"a hold-back window holds 0 characters or more, not {window}")
        self.window = window
        self._held: collections.deque[ChatCompletionChunk] = collections.deque()
        self._chars = 0

    def text(self) -> str:
        """The text held now: what passed the hooks and the client has not received."""
        return "".join(chunk_text(c) for c in self._held)

    def hold(self, chunk: ChatCompletionChunk) -> None:
        """`chunk` passed the hooks: it waits behind the chunks held before it."""
        self._held.append(chunk)
        self._chars += len(chunk_text(chunk))

    def replace(self, text: str, like: ChatCompletionChunk) -> None:
        """A hook rewrote the held text to `text`: the first held chunk with text carries it
        all, the other text-only chunks go (those with a role, tool calls or a finish keep
        their place without text). With no text held, a chunk shaped `like` (its id, model
        and choice index) carries it."""
        kept: collections.deque[ChatCompletionChunk] = collections.deque()
        carrier: ChatCompletionChunk | None = None
        for held in self._held:
            if not chunk_text(held):
                kept.append(held)
                continue
            delta = held.choices[0].delta
            if carrier is None:
                carrier = held
                delta.content = text
                kept.append(held)
            elif delta.role is not None or delta.tool_calls or held.choices[0].finish_reason is not None:
                delta.content = None
                kept.append(held)
        if carrier is None and text:
            carrier = like.model_copy(deep=True)
            carrier.choices[0].delta = type(carrier.choices[0].delta)(content=text)
            carrier.choices[0].finish_reason = None
            kept.append(carrier)
        self._held = kept
        self._chars = len(text)

    def release(self) -> list[ChatCompletionChunk]:
        """What leaves the window now (all but its last `window` characters), in order."""
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


def whole_answer_chunk(answer: ChatCompletion) -> ChatCompletionChunk:
    """A non-streamed answer as the one chunk its windowed on_chunk hooks judge: its text and
    tool calls, its finish and its usage together, so that a worker group judges it in one
    hop (as the stream's three chunks it took two)."""
    chunk, finish, *usage = completion_chunks(answer)
    chunk.choices[0].finish_reason = finish.choices[0].finish_reason
    chunk.usage = usage[0].usage if usage else None
    return chunk
