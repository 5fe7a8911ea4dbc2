"""What the client gets at the end of a run: the completion, its one finish_reason, and a
stream's closing usage chunk."""

from __future__ import annotations

import time

from openai.types.chat import ChatCompletion, ChatCompletionChunk

from hookbus.services.orchestrator.loop import client_tools
from hookbus.services.orchestrator.loop.request_state import RequestState


def final_completion(state: RequestState, model: str) -> ChatCompletion:
    """The last LLM answer as the client gets it. A shallow copy with its own id, model,
    usage and first choice (50 us less than a deep copy): the answer it was made from
    stays as the run recorded it."""
    response = state.last_response
    assert response is not None
    first = response.choices[0]
    last = next((m for m in reversed(state.conversation) if m.get("role") == "assistant"), None)
    content = last.get("content") if last is not None else first.message.content
    choice = first.model_validate(
        {
            "index": 0,
            "message": client_tools.returned_message(content, state.client_calls),
            "finish_reason": finish_reason(state),
            "logprobs": first.logprobs,
        }
    )
    return response.model_copy(
        update={"id": state.completion_id, "model": model, "usage": state.usage, "choices": [choice, *response.choices[1:]]}
    )


def finish_reason(state: RequestState) -> str:
    """The turn's one finish_reason: tool_calls only for calls the client must run."""
    if state.client_calls:
        return "tool_calls"
    reason = state.last_response.choices[0].finish_reason if state.last_response else None
    return "stop" if reason in (None, "tool_calls", "function_call") else reason


def usage_chunk(state: RequestState, model: str) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate(
        {
            "id": state.completion_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "choices": [],
            "usage": state.usage.model_dump() if state.usage else None,
        }
    )
