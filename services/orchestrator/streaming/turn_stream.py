"""A streamed run as the client sees it: one assistant turn, whatever the agent did inside.

The agent may make several LLM calls in one request (its own tool rounds). A client reading
a Chat Completions stream expects one turn: one role delta, the text, tool-call deltas only
for the tools *it* must run, and exactly one chunk with a `finish_reason`. Without this,
every round's tool-call deltas (their `index` restarting at 0) and finish chunks reached the
client, which merged or re-ran the server's tool calls.

`TurnStream.visible(chunk)` takes each chunk after the `on_chunk` hooks and returns what of
it the client may see (the role delta only the first time, no tool-call deltas, no
finish_reason); `TurnStream.finish(...)` returns the closing chunks: the client tool calls
(one delta each, indexed from 0 over the client's calls only) and the one finish chunk.
"""

from __future__ import annotations

import time
from typing import Any

from openai.types.chat import ChatCompletionChunk


class TurnStream:
    """The client-visible chunks of one streamed request."""

    def __init__(self, completion_id: str, model: str) -> None:
        self.completion_id = completion_id
        self.model = model
        self.role_sent = False

    def visible(self, chunk: ChatCompletionChunk) -> ChatCompletionChunk | None:
        """`chunk` without what belongs to the agent's own rounds; None when nothing is left."""
        if not chunk.choices:
            return None
        if not _agents_own(chunk):
            return chunk if _shows_something(chunk) else None  # most text chunks: nothing to take out, no copy
        # shallow copies of the three objects that change, as if assigned: a deep copy of each
        # chunk that carries a role (some servers send it on every one) was 1.2% of the
        # orchestrator's CPU in the cost bench
        first = chunk.choices[0]
        role = first.delta.role
        update: dict[str, Any] = {"tool_calls": None}
        if role is not None:
            if self.role_sent:
                role = update["role"] = None
            else:
                self.role_sent = True
        if getattr(first.delta, "function_call", None) is not None:
            update["function_call"] = None
        delta = first.delta.model_copy(update=update)
        choice = first.model_copy(update={"delta": delta, "finish_reason": None})
        shown = chunk.model_copy(update={"choices": [choice, *chunk.choices[1:]]})
        if role is not None:
            return shown
        return shown if _shows_something(shown) else None

    def finish(self, finish_reason: str, client_calls: list[dict[str, Any]]) -> list[ChatCompletionChunk]:
        """The closing chunks: a role delta if none went out yet, the client's tool calls, the finish."""
        closing: list[ChatCompletionChunk] = []
        if not self.role_sent:
            self.role_sent = True
            closing.append(self._chunk({"role": "assistant", "content": ""}))
        if client_calls:
            calls = [
                {
                    "index": index,
                    "id": call.get("id", ""),
                    "type": "function",
                    "function": {
                        "name": call.get("function", {}).get("name", ""),
                        "arguments": call.get("function", {}).get("arguments", ""),
                    },
                }
                for index, call in enumerate(client_calls)
            ]
            closing.append(self._chunk({"tool_calls": calls}))
        closing.append(self._chunk({}, finish_reason))
        return closing

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk.model_validate(
            {
                "id": self.completion_id,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }
        )


def _agents_own(chunk: ChatCompletionChunk) -> bool:
    """Whether the chunk holds what `visible` may have to take out: a tool call or a finish
    of the agent's own round, or a role delta (shown once)."""
    choice = chunk.choices[0]
    delta = choice.delta
    return bool(
        delta.tool_calls
        or getattr(delta, "function_call", None) is not None
        or choice.finish_reason is not None
        or delta.role is not None
    )


def _shows_something(chunk: ChatCompletionChunk) -> bool:
    choice = chunk.choices[0]
    delta = choice.delta
    return bool(delta.content or choice.logprobs or getattr(delta, "refusal", None))
