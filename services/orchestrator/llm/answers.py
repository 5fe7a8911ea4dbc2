"""What an answer must be before it is passed on, and what it is as chunks.

An answer that is no OpenAI answer is a 502 in words (`unreadable_answer`); one that says
nothing is `EmptyAnswer` (under `tool_choice: "auto"`, nothing but a tool-call marker
counts as nothing: `tool_markers`); a completion becomes the chunks of its stream
(`completion_chunks`), and the usage an endpoint did not send is counted here
(`estimated_usage`).
"""

from __future__ import annotations

from typing import Any

from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage

from hookbus.services.orchestrator.compaction.tokens import count_messages, count_text
from hookbus.skills.errors import UpstreamError


def unreadable_answer(what: str) -> UpstreamError:
    """The 502 for an answer that is no OpenAI answer (HTML, a broken line, an array):
    the endpoint failed us, whatever Python made of its bytes."""
    return UpstreamError(502, "upstream_bad_response", f"the LLM endpoint's answer could not be read: {what}")


def is_completion(response: object) -> bool:
    """Whether the client's (lenient) completion has the shape the agent reads: a list
    of choices, each with a message."""
    choices = getattr(response, "choices", None)
    return isinstance(response, ChatCompletion) and isinstance(choices, list) and all(
        isinstance(getattr(choice, "message", None), ChatCompletionMessage) for choice in choices
    )


def response_text(response: ChatCompletion) -> str:
    if not response.choices:
        return ""
    message = response.choices[0].message
    arguments = "".join(c.function.arguments for c in message.tool_calls or () if hasattr(c, "function"))
    return (message.content or "") + arguments


def completion_chunks(completion: ChatCompletion) -> list[ChatCompletionChunk]:
    """A completion as the chunks of its stream: its text and tool calls, the finish chunk,
    then the usage chunk."""
    choice = completion.choices[0]
    delta: dict[str, Any] = {"role": "assistant", "content": choice.message.content or ""}
    if choice.message.tool_calls:
        delta["tool_calls"] = [
            {"index": i, **call.model_dump(exclude_none=True)} for i, call in enumerate(choice.message.tool_calls)
        ]
    head = {"id": completion.id, "object": "chat.completion.chunk", "created": completion.created,
            "model": completion.model}
    chunks = [
        {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice.finish_reason}]},
    ]
    if completion.usage is not None:
        chunks.append({**head, "choices": [], "usage": completion.usage.model_dump()})
    return [ChatCompletionChunk.model_validate(chunk) for chunk in chunks]


def said_nothing(message: Any, markers: tuple[str, ...]) -> bool:
    return not message.tool_calls and says_nothing(message.content or "", markers)


def says_nothing(text: str, markers: tuple[str, ...]) -> bool:
    """No text, or nothing but one of `markers`."""
    return not text or text.strip() in markers


def may_say_nothing(text: str, markers: tuple[str, ...]) -> bool:
    """Whether a text so far may still end as no text or nothing but one of `markers`."""
    return not text or any(marker.startswith(text.lstrip()) for marker in markers)


def under_auto(arguments: dict[str, Any]) -> bool:
    """Whether the call offered tools and left the choice to the model."""
    return arguments.get("tool_choice") == "auto"


def tool_markers(arguments: dict[str, Any]) -> tuple[str, ...]:
    """Under "auto", the tool-call markers that are no answer as text: llama-cpp-python's
    `chatml-function-calling` format, asked to answer in text under "auto", can only end
    the turn or write `functions.NAME:` for an offered tool (and leaves it as the text)."""
    if not under_auto(arguments):
        return ()
    return tuple(f"functions.{tool['function']['name']}:" for tool in arguments["tools"] if tool.get("function"))


class EmptyAnswer(UpstreamError):
    """An answer with no text and no tool call (or, under "auto", nothing but a tool-call
    marker: `tool_markers`): never passed on as an empty success, since a client (or `hookbus
    send`) cannot tell it from a model that had nothing to say.

    `under_auto`: the call offered tools under `tool_choice: "auto"`, and nothing of the
    answer reached the caller (a stream's chunks were held), so the call can be asked again
    with `"none"`. `usage`: what the empty answer cost, as the endpoint reported it."""

    def __init__(
        self, finish_reason: str | None, text: str | None, *, under_auto: bool, usage: CompletionUsage | None
    ) -> None:
        said = f"no tool call, no text but {text.strip()!r}" if text and text.strip() else "no text and no tool call"
        super().__init__(
            502, "empty_answer", f"the model's answer said nothing: {said} (finish_reason {finish_reason or 'none'})"
        )
        self.finish_reason = finish_reason
        self.under_auto = under_auto
        self.usage = usage


def chunk_texts(chunk: ChatCompletionChunk) -> list[str]:
    texts: list[str] = []
    for choice in chunk.choices:
        if choice.delta.content:
            texts.append(choice.delta.content)
        for call in choice.delta.tool_calls or ():
            if call.function is not None and call.function.arguments:
                texts.append(call.function.arguments)
    return texts


def estimated_usage(messages: list[dict[str, Any]], produced: str) -> CompletionUsage:
    """Usage counted with tiktoken, for an endpoint that sent none; `estimated` says so."""
    prompt = count_messages(messages)
    completion = count_text(produced)
    usage = CompletionUsage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
    usage.estimated = True  # type: ignore[attr-defined]  # openai's models keep extra fields
    return usage


def usage_chunk(usage: CompletionUsage, model: str) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate(
        {"id": "", "object": "chat.completion.chunk", "created": 0, "model": model,
         "choices": [], "usage": usage.model_dump()}
    )
