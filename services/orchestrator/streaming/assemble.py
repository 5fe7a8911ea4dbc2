"""Builds the whole model response out of streamed chunks.

`after_llm_call` sees a complete ChatCompletion whether the call streamed or not, so a
hook is written once; this module does the assembly from the chunks the client saw.
"""

from __future__ import annotations

import time
from typing import Any

from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk


class ChunkAssembler:
    """Accumulates chunk deltas (text and tool-call fragments) into one message."""

    def __init__(self, completion_id: str, model: str) -> None:
        self.completion_id = completion_id
        self.model = model
        self.content: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: CompletionUsage | None = None
        self.saw_content = False

    def add(self, chunk: ChatCompletionChunk) -> None:
        if chunk.usage is not None:
            self.usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content is not None:
                self.content.append(delta.content)
                self.saw_content = True
            for call in delta.tool_calls or ():
                slot = self.tool_calls.setdefault(
                    call.index,
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if call.id:
                    slot["id"] = call.id
                if call.function is not None:
                    name = call.function.name
                    if name and name != slot["function"]["name"]:  # llama.cpp repeats the whole name
                        slot["function"]["name"] += name
                    if call.function.arguments:
                        slot["function"]["arguments"] += call.function.arguments
            if choice.finish_reason is not None:
                self.finish_reason = choice.finish_reason

    def completion(self) -> ChatCompletion:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.content) if self.saw_content or not self.tool_calls else None,
        }
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        finish = self.finish_reason or ("tool_calls" if self.tool_calls else "stop")
        return ChatCompletion.model_validate(
            {
                "id": self.completion_id,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": self.usage.model_dump() if self.usage else None,
            }
        )


def add_usage(total: CompletionUsage | None, more: CompletionUsage | None) -> CompletionUsage | None:
    """Usage summed over every LLM call of a request; `estimated` when any part was counted
    by hookbus rather than reported by the endpoint."""
    if more is None:
        return total
    parts = [more] if total is None else [total, more]
    summed = CompletionUsage(
        prompt_tokens=sum(p.prompt_tokens for p in parts),
        completion_tokens=sum(p.completion_tokens for p in parts),
        total_tokens=sum(p.total_tokens for p in parts),
    )
    if any(getattr(p, "estimated", False) for p in parts):
        summed.estimated = True  # type: ignore[attr-defined]  # openai's models keep extra fields
    return summed
