"""Realistic stage data for hops: an on_chunk with a ChatCompletionChunk, and a
before_llm_call carrying a 20-message conversation and two tools."""

from __future__ import annotations

import time
import uuid
from typing import Any

from openai.types.chat import ChatCompletionChunk

from hookbus.skills import AuthInfo, Context, HookData
from hookbus.skills.context import Metadata, Session


def context() -> Context:
    return Context(
        auth=AuthInfo(peer_user_id="user-42", scopes=["chat"]),
        metadata=Metadata(completion_id=f"chatcmpl-{uuid.uuid4().hex}", model="offline", agent_name="bench"),
        session=Session(id=None),
        state={"request_started": time.time(), "tenant": "acme"},
    )


def chunk(index: int = 7) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": "offline",
            "choices": [{"index": 0, "delta": {"content": f" w{index}"}, "finish_reason": None}],
        }
    )


def on_chunk_data(index: int = 7) -> HookData:
    text = " ".join(f"w{i}" for i in range(index + 1))
    return HookData.model_construct(
        lifecycle="on_chunk", chunk=chunk(index), content=f" w{index}", chunk_index=index, full_content=text
    )


def conversation(n: int = 20) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant. " * 4}]
    for i in range(1, n):
        if i % 2:
            messages.append({"role": "user", "content": f"Question {i}: " + "tell me about streams and hooks. " * 6})
        else:
            messages.append({"role": "assistant", "content": f"Answer {i}: " + "Redis streams keep entries in order. " * 8})
    return messages


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
    for name in ("search", "lookup")
]


def before_llm_call_data() -> HookData:
    return HookData.model_construct(
        lifecycle="before_llm_call", messages=conversation(20), tools=[dict(t) for t in TOOLS], iteration=0
    )


KINDS = {"on_chunk": on_chunk_data, "before_llm_call": before_llm_call_data}
