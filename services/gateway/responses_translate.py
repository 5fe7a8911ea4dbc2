"""Responses API <-> Chat Completions: a Responses request becomes the same queue request a
Chat Completions client would send, and the run's completion or chunks become a Response
or its stream events.

Input items map to chat messages in order: a `message` to a message of its role (text
parts joined, images as `image_url` parts), consecutive `function_call` items to one
assistant message with `tool_calls` (joined to the assistant text right before them, as
the model produced them together), a `function_call_output` to a `tool` message.
`instructions` is a system message in front, for this response only: a later response
that continues from it (`previous_response_id`) does not inherit it, as with OpenAI.

Request fields map to their Chat Completions names: `max_output_tokens` to
`max_completion_tokens`, `text.format` to `response_format`, function tools and a named
`tool_choice` to their nested chat form; the rest keep their names.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import ValidationError

from hookbus.services.gateway.errors import GatewayError
from hookbus.services.gateway.models import ChatCompletionRequest
from hookbus.services.gateway.responses_models import (
    ArgumentsDeltaEvent,
    ArgumentsDoneEvent,
    ContentPartEvent,
    ErrorEvent,
    IncompleteDetails,
    InputContent,
    InputFunctionCall,
    InputFunctionCallOutput,
    InputMessage,
    InputTokensDetails,
    OutputFunctionCall,
    OutputItem,
    OutputItemEvent,
    OutputMessage,
    OutputText,
    OutputTokensDetails,
    ResponseError,
    ResponseLifecycleEvent,
    ResponseObject,
    ResponsesRequest,
    StreamEvent,
    TextConfig,
    TextDeltaEvent,
    TextDoneEvent,
    TextFormat,
    ToolChoiceFunction,
    Usage,
)
from hookbus.skills import HookbusError

RESPONSES_NAMES = {
    "messages": "input", "max_completion_tokens": "max_output_tokens", "response_format": "text.format",
}
"""Chat Completions field -> the Responses field it came from (for a 400's `param`)."""


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


# ------------------------------------------------------------------- requests


def input_messages(payload: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input items as chat messages (without `instructions`)."""
    if payload.input is None:
        return []
    if isinstance(payload.input, str):
        return [{"role": "user", "content": payload.input}]
    messages: list[dict[str, Any]] = []
    for item in payload.input:
        if isinstance(item, InputMessage):
            messages.append({"role": item.role, "content": _message_content(item)})
        elif isinstance(item, InputFunctionCall):
            call = {
                "id": item.call_id, "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and isinstance(last.get("content"), str | None):
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, InputFunctionCallOutput):
            output = item.output if isinstance(item.output, str) else "".join(p.text for p in item.output)
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
    return messages


def _message_content(message: InputMessage) -> str | list[dict[str, Any]]:
    if isinstance(message.content, str):
        return message.content
    if message.role == "user" and any(part.type == "input_image" for part in message.content):
        return [_chat_part(part) for part in message.content]
    return "".join(_part_text(part) for part in message.content)


def _part_text(part: InputContent) -> str:
    if part.type == "input_image":
        raise GatewayError(400, "invalid_value", "only user messages may hold images", param="input")
    return (part.refusal if part.type == "refusal" else part.text) or ""


def _chat_part(part: InputContent) -> dict[str, Any]:
    if part.type != "input_image":
        return {"type": "text", "text": _part_text(part)}
    if not part.image_url:
        raise GatewayError(
            400, "invalid_value", "input_image needs an image_url (file ids are not served here)",
            param="input",
        )
    image: dict[str, Any] = {"url": part.image_url}
    if part.detail:
        image["detail"] = part.detail
    return {"type": "image_url", "image_url": image}


def chat_request(
    payload: ResponsesRequest, history: list[dict[str, Any]], new_input: list[dict[str, Any]]
) -> ChatCompletionRequest:
    """The Chat Completions request that runs this response: `history` (the conversation
    of `previous_response_id`) then the new input, after the instructions."""
    try:
        return ChatCompletionRequest.model_validate(chat_body(payload, history, new_input))
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "messages"
        param = RESPONSES_NAMES.get(field, field)
        problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors()[:3])
        raise GatewayError(400, "invalid_value", f"invalid {param}: {problems}", param=param) from None


def chat_body(
    payload: ResponsesRequest, history: list[dict[str, Any]], new_input: list[dict[str, Any]]
) -> dict[str, Any]:
    """The Chat Completions request body (fields that are not set are left out)."""
    messages = list(history) + list(new_input)
    if payload.instructions:
        messages.insert(0, {"role": "system", "content": payload.instructions})
    if not messages:
        raise GatewayError(400, "missing_required_parameter", "input is required", param="input")
    body: dict[str, Any] = {
        "model": payload.model,
        "messages": messages,
        "stream": bool(payload.stream),
        "user": payload.user,
        "metadata": payload.metadata,
        "temperature": payload.temperature,
        "top_p": payload.top_p,
        "max_completion_tokens": payload.max_output_tokens,
        "parallel_tool_calls": payload.parallel_tool_calls,
    }
    if payload.stream:
        body["stream_options"] = {"include_usage": True}  # the usage of response.completed
    if payload.tools:
        body["tools"] = [
            {"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)}
            for tool in payload.tools
        ]
    if isinstance(payload.tool_choice, ToolChoiceFunction):
        body["tool_choice"] = {"type": "function", "function": {"name": payload.tool_choice.name}}
    elif payload.tool_choice is not None:
        body["tool_choice"] = payload.tool_choice
    response_format = _response_format(payload.text)
    if response_format is not None:
        body["response_format"] = response_format
    return {k: v for k, v in body.items() if v is not None}


def _response_format(text: TextConfig | None) -> dict[str, Any] | None:
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if not fmt.name or fmt.schema_ is None:
        raise GatewayError(
            400, "missing_required_parameter", "text.format of type json_schema needs name and schema",
            param="text.format",
        )
    schema = {"name": fmt.name, "schema": fmt.schema_, "description": fmt.description, "strict": fmt.strict}
    return {"type": "json_schema", "json_schema": {k: v for k, v in schema.items() if v is not None}}


# ------------------------------------------------------------------- answers


def new_response(payload: ResponsesRequest, response_id: str) -> ResponseObject:
    """The response as it starts (`in_progress`): the request's settings echoed."""
    return ResponseObject(
        id=response_id,
        created_at=time.time(),
        status="in_progress",
        instructions=payload.instructions,
        metadata=payload.metadata or {},
        model=payload.model,
        parallel_tool_calls=payload.parallel_tool_calls is not False,
        previous_response_id=payload.previous_response_id,
        store=payload.store is not False,
        temperature=payload.temperature,
        text=payload.text or TextConfig(format=TextFormat(type="text")),
        tool_choice=payload.tool_choice or "auto",
        tools=payload.tools or [],
        top_p=payload.top_p,
        max_output_tokens=payload.max_output_tokens,
        user=payload.user,
    )


def usage_of(usage: dict[str, Any] | None) -> Usage | None:
    """Chat Completions usage (summed over the request's LLM calls) in Responses terms."""
    if not usage:
        return None
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    return Usage(
        input_tokens=usage.get("prompt_tokens") or 0,
        input_tokens_details=InputTokensDetails(cached_tokens=prompt_details.get("cached_tokens") or 0),
        output_tokens=usage.get("completion_tokens") or 0,
        output_tokens_details=OutputTokensDetails(
            reasoning_tokens=completion_details.get("reasoning_tokens") or 0
        ),
        total_tokens=usage.get("total_tokens") or 0,
    )


def finish(
    response: ResponseObject, output: list[OutputItem], usage: Usage | None, finish_reason: str | None
) -> ResponseObject:
    """The response at its end: `incomplete` when the model stopped at its token limit."""
    cut = finish_reason == "length"
    return response.model_copy(
        update={
            "status": "incomplete" if cut else "completed",
            "incomplete_details": IncompleteDetails(reason="max_output_tokens") if cut else None,
            "completed_at": time.time(),
            "output": output,
            "usage": usage,
        }
    )


def failed(response: ResponseObject, error: HookbusError) -> ResponseObject:
    code = {429: "rate_limit_exceeded", 400: "invalid_prompt"}.get(error.status_code, "server_error")
    return response.model_copy(
        update={"status": "failed", "error": ResponseError(code=code, message=error.message)}  # type: ignore[arg-type]
    )


def from_completion(response: ResponseObject, completion: dict[str, Any]) -> ResponseObject:
    """The finished response of a non-streamed run's final chat completion."""
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    output: list[OutputItem] = []
    if message.get("content") or not message.get("tool_calls"):
        text = OutputText(text=message.get("content") or "")
        output.append(OutputMessage(id=_item_id("msg"), content=[text]))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        output.append(
            OutputFunctionCall(
                id=_item_id("fc"), call_id=call.get("id") or _item_id("call"),
                name=function.get("name") or "", arguments=function.get("arguments") or "",
            )
        )
    return finish(response, output, usage_of(completion.get("usage")), choice.get("finish_reason"))


def assistant_message(response: ResponseObject) -> dict[str, Any] | None:
    """The response's output as the chat message the next turn's conversation holds."""
    text = response.output_text()
    calls = [
        {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
        for item in response.output
        if isinstance(item, OutputFunctionCall)
    ]
    if not text and not calls:
        return None
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _item_id(kind: str) -> str:
    return f"{kind}_{uuid.uuid4().hex}"


class ResponseEvents:
    """The stream events of one response, built from the run's chat chunks in order.

    Text opens a `message` output item (and its one `output_text` part); each tool call
    index opens a `function_call` item; an item is closed (`.done` events) when another
    starts or the run ends. `sequence_number` counts every event from 0.
    """

    def __init__(self, response: ResponseObject) -> None:
        self.response = response
        self._seq = 0
        self._output: list[OutputItem] = []
        self._open: OutputMessage | OutputFunctionCall | None = None
        self._calls: dict[int, OutputFunctionCall] = {}
        self._usage: Usage | None = None
        self._finish_reason: str | None = None

    def started(self) -> list[StreamEvent]:
        return [self._lifecycle("response.created"), self._lifecycle("response.in_progress")]

    def chunk(self, chunk: dict[str, Any]) -> list[StreamEvent]:
        if chunk.get("usage"):
            self._usage = usage_of(chunk["usage"])
        events: list[StreamEvent] = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                events += self._text(delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._call(call)
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
        return events

    def completed(self) -> list[StreamEvent]:
        events = self._close()
        self.response = finish(self.response, self._output, self._usage, self._finish_reason)
        kind = "response.incomplete" if self.response.status == "incomplete" else "response.completed"
        return [*events, self._lifecycle(kind)]

    def failed(self, error: HookbusError) -> list[StreamEvent]:
        """An `error` event with the hook's code and message, then `response.failed`."""
        events = self._close()
        param = getattr(error, "param", None)
        events.append(ErrorEvent(sequence_number=self._next(), code=error.code, message=error.message, param=param))
        self.response = failed(self.response.model_copy(update={"output": self._output}), error)
        events.append(self._lifecycle("response.failed"))
        return events

    # ---------------------------------------------------------------- internals

    def _next(self) -> int:
        self._seq += 1
        return self._seq - 1

    def _lifecycle(self, kind: str) -> ResponseLifecycleEvent:
        return ResponseLifecycleEvent(type=kind, sequence_number=self._next(), response=self.response)  # type: ignore[arg-type]

    def _text(self, delta: str) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        message = self._open
        if not isinstance(message, OutputMessage):
            events += self._close()
            message = OutputMessage(id=_item_id("msg"), status="in_progress")
            events += self._add(message)
            events.append(
                ContentPartEvent(
                    type="response.content_part.added", sequence_number=self._next(),
                    item_id=message.id, output_index=len(self._output) - 1, part=OutputText(text=""),
                )
            )
            message.content.append(OutputText(text=""))
        message.content[0].text += delta
        events.append(
            TextDeltaEvent(sequence_number=self._next(), item_id=message.id, output_index=len(self._output) - 1, delta=delta)
        )
        return events

    def _call(self, call: dict[str, Any]) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        index = int(call.get("index") or 0)
        function = call.get("function") or {}
        item = self._calls.get(index)
        if item is None:
            events += self._close()
            item = OutputFunctionCall(
                id=_item_id("fc"), call_id=call.get("id") or _item_id("call"),
                name=function.get("name") or "", status="in_progress",
            )
            self._calls[index] = item
            events += self._add(item)
        arguments = function.get("arguments") or ""
        if arguments:
            item.arguments += arguments
            events.append(
                ArgumentsDeltaEvent(
                    sequence_number=self._next(), item_id=item.id,
                    output_index=self._output.index(item), delta=arguments,
                )
            )
        return events

    def _add(self, item: OutputMessage | OutputFunctionCall) -> list[StreamEvent]:
        self._output.append(item)
        self._open = item
        added = OutputItemEvent(
            type="response.output_item.added", sequence_number=self._next(),
            output_index=len(self._output) - 1, item=item.model_copy(deep=True),
        )
        return [added]

    def _close(self) -> list[StreamEvent]:
        item, self._open = self._open, None
        if item is None:
            return []
        index = self._output.index(item)
        events: list[StreamEvent] = []
        item.status = "completed"
        if isinstance(item, OutputMessage):
            part = item.content[0]
            events.append(
                TextDoneEvent(sequence_number=self._next(), item_id=item.id, output_index=index, text=part.text)
            )
            events.append(
                ContentPartEvent(
                    type="response.content_part.done", sequence_number=self._next(),
                    item_id=item.id, output_index=index, part=part.model_copy(),
                )
            )
        else:
            events.append(
                ArgumentsDoneEvent(
                    sequence_number=self._next(), item_id=item.id, output_index=index,
                    name=item.name, arguments=item.arguments,
                )
            )
        events.append(
            OutputItemEvent(
                type="response.output_item.done", sequence_number=self._next(),
                output_index=index, item=item.model_copy(deep=True),
            )
        )
        return events
