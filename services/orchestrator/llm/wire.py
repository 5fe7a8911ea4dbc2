"""One call as it goes over HTTP: its arguments, its body, and the chunks of its stream."""

from __future__ import annotations

import json
from typing import Any, TypeVar

import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import ValidationError

from hookbus.services.orchestrator.llm.answers import unreadable_answer
from hookbus.services.process.offload import is_large, off_loop
from hookbus.skills.model_settings import ModelSettings


async def create_chat_completion(client: openai.AsyncOpenAI, arguments: dict[str, Any]) -> Any:
    """What `client.chat.completions.create(**arguments)` does, minus its transform.

    `create` walks every message and field in Python on the event loop to adapt typed
    params (12 s for 123,000 tiny messages); our arguments are plain JSON already, so
    the body is encoded as is (off the loop when large) and posted through the same
    client: same HTTP stack, retries, errors and SSE reading. Returns a
    ChatCompletion (built by BuiltCompletion), or an AsyncStream of chunks (built by
    StreamedChunk) when `arguments["stream"]`.
    """
    large = is_large(arguments.get("messages"))
    body = await off_loop(large, json_body, arguments)
    return await client.post(
        "/chat/completions",
        content=body,  # the client's default Content-Type is application/json
        cast_to=BuiltCompletion,
        stream=bool(arguments.get("stream")),
        stream_cls=openai.AsyncStream[StreamedChunk],
    )


class StreamedChunk:
    """How the client builds each chunk of a stream (its model-builder protocol: a
    `cast_to` with a `build` classmethod is asked to build the value): validated by
    pydantic-core in one call, about 30 times cheaper than the client's lenient
    recursive construct (10 vs 316 us a chunk; it was 8% of the orchestrator's CPU
    under the cost bench). A chunk the model refuses (an endpoint's odd field) is built
    leniently, as the client builds every chunk, when its choices still have the shape
    of a chunk's; anything else (an array, `{"choices": "many"}`) is the endpoint's
    garbage: a 502 `upstream_bad_response`. The SSE reading, the `error` event and the
    HTTP errors stay the client's."""

    @classmethod
    def build(cls, *, response: object, data: object) -> ChatCompletionChunk:
        return _built(ChatCompletionChunk, data, "delta", "an event of its stream is not a chunk")


class BuiltCompletion(openai.BaseModel):
    """How the client builds a completion that is not streamed, as StreamedChunk builds
    a chunk: 10 us against 205 us for the client's lenient construct (the gateways
    bench's 20-word answer, on the 2-core VM). An answer that is not a completion is a
    502 `upstream_bad_response`. (The client takes only its own BaseModel's subclasses
    as the type of a body; it never makes one of this class.)"""

    @classmethod
    def build(cls, *, response: object, data: object) -> ChatCompletion:
        return _built(ChatCompletion, data, "message", "it is not a chat completion")


ModelT = TypeVar("ModelT", ChatCompletion, ChatCompletionChunk)


def _built(model: type[ModelT], data: object, part: str, garbage: str) -> ModelT:
    """`data` validated as `model`; built leniently (as the client builds everything)
    when the model refuses it but its choices hold objects where `part` goes; else the
    endpoint's garbage, `garbage` saying what."""
    if not isinstance(data, dict):
        raise unreadable_answer(garbage)
    try:
        return model.model_validate(data)
    except ValidationError:
        if not _choices_hold(data, part):
            raise unreadable_answer(garbage) from None
        return model.construct(**data)


def _choices_hold(data: dict[str, Any], part: str) -> bool:
    """Whether `data["choices"]` (absent: none) is a list of objects whose `part` (the
    chunk's `delta`, the completion's `message`), where present, is an object."""
    choices = data.get("choices", [])
    return isinstance(choices, list) and all(
        isinstance(choice, dict) and isinstance(choice.get(part, {}), dict) for choice in choices
    )


def json_body(arguments: dict[str, Any]) -> bytes:
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()



def request_arguments(
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    settings: ModelSettings | None,
) -> dict[str, Any]:
    """The `chat.completions.create` arguments of one call.

    `tool_choice` and `parallel_tool_calls` go only with tools (OpenAI refuses them
    without); with tools and no `tool_choice`, "auto" is sent explicitly."""
    arguments: dict[str, Any] = {"model": model, "messages": upstream_messages(messages)}
    given = settings.given() if settings is not None else {}
    choice = given.pop("tool_choice", None)
    parallel = given.pop("parallel_tool_calls", None)
    arguments.update(given)
    if tools:
        arguments["tools"] = tools
        arguments["tool_choice"] = choice or "auto"
        if parallel is not None:
            arguments["parallel_tool_calls"] = parallel
    return arguments


def upstream_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages in the form OpenAI, vLLM and llama.cpp all accept: no legacy
    `function_call`, no null fields, and an assistant message with tool calls and no
    text has `content: ""` (llama.cpp's server answers `content: null` with a 500)."""
    sent = []
    for message in messages:
        clean = {k: v for k, v in message.items() if v is not None and k != "function_call"}
        if clean.get("role") == "assistant" and "content" not in clean:
            clean["content"] = ""
        sent.append(clean)
    return sent
