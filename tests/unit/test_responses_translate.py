"""Responses API <-> Chat Completions translation, checked against the openai SDK's types."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from hookbus.services.gateway.errors import GatewayError
from hookbus.services.gateway.responses_models import ResponsesRequest
from hookbus.services.gateway.responses_translate import (
    ResponseEvents,
    assistant_message,
    chat_body,
    chat_request,
    from_completion,
    input_messages,
    new_response,
)
from hookbus.skills import HookError

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def wire(model: Any) -> dict[str, Any]:
    return model.model_dump(mode="json", by_alias=True)


def request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "offline", **fields})


def test_input_items_become_chat_messages_in_order():
    payload = request(input=[
        {"role": "user", "content": [{"type": "input_text", "text": "add 2 and 3"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me add."}]},
        {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a":2,"b":3}'},
        {"type": "function_call", "call_id": "call_2", "name": "log", "arguments": "{}"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call_output", "call_id": "call_1", "output": "5"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "ok"}]},
    ])
    assert input_messages(payload) == [
        {"role": "user", "content": "add 2 and 3"},
        {"role": "assistant", "content": "Let me add.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a":2,"b":3}'}},
            {"id": "call_2", "type": "function", "function": {"name": "log", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
        {"role": "tool", "tool_call_id": "call_2", "content": "ok"},
    ]


def test_request_fields_take_their_chat_completions_names():
    payload = request(
        input="hi", instructions="Be brief.", temperature=0.5, top_p=0.9, max_output_tokens=64,
        parallel_tool_calls=False, tool_choice={"type": "function", "name": "add"}, stream=True,
        tools=[{"type": "function", "name": "add", "description": "Add.", "parameters": {"type": "object"}}],
        text={"format": {"type": "json_schema", "name": "sum", "schema": {"type": "object"}, "strict": True}},
    )
    history = [{"role": "user", "content": "before"}]
    assert chat_body(payload, history, input_messages(payload)) == {
        "model": "offline",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "before"},
            {"role": "user", "content": "hi"},
        ],
        "stream": True, "stream_options": {"include_usage": True},
        "temperature": 0.5, "top_p": 0.9, "max_completion_tokens": 64, "parallel_tool_calls": False,
        "tool_choice": {"type": "function", "function": {"name": "add"}},
        "tools": [{"type": "function", "function": {
            "name": "add", "description": "Add.", "parameters": {"type": "object"},
        }}],
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "sum", "schema": {"type": "object"}, "strict": True,
        }},
    }
    chat = chat_request(payload, history, input_messages(payload))
    assert chat.include_usage and len(chat.messages) == 3


@pytest.mark.parametrize("fields, param", [
    ({"input": []}, "input"),
    ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "1"}]}, "input"),
    ({"input": "hi", "text": {"format": {"type": "json_schema"}}}, "text.format"),
    ({"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
])
def test_requests_that_cannot_run_are_refused_naming_the_field(fields, param):
    payload = request(**fields)
    with pytest.raises(GatewayError) as caught:
        chat_request(payload, [], input_messages(payload))
    assert caught.value.status_code == 400 and caught.value.param == param


def test_a_completion_with_text_and_tool_calls_is_a_valid_sdk_response():
    completion = {
        "choices": [{"finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Calling.",
            "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
        }}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14,
                  "prompt_tokens_details": {"cached_tokens": 3}},
    }
    response = from_completion(new_response(request(input="hi", metadata={"k": "v"}), "resp_1"), completion)
    parsed = Response.model_validate(wire(response))
    assert [item.type for item in parsed.output] == ["message", "function_call"]
    assert parsed.output_text == "Calling."
    assert parsed.usage is not None and parsed.usage.input_tokens_details.cached_tokens == 3
    assert parsed.metadata == {"k": "v"} and parsed.status == "completed"
    assert assistant_message(response) == {"role": "assistant", "content": "Calling.", "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "add", "arguments": "{}"}},
    ]}


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_chunks_become_sdk_stream_events_for_text_then_function_calls():
    events = ResponseEvents(new_response(request(input="hi", stream=True), "resp_2"))
    out = events.started()
    out += events.chunk(chunk({"role": "assistant"}))
    out += events.chunk(chunk({"content": "Let me "}))
    out += events.chunk(chunk({"content": "check."}))
    out += events.chunk(chunk({"tool_calls": [
        {"index": 0, "id": "call_a", "function": {"name": "lookup", "arguments": '{"q":'}},
    ]}))
    out += events.chunk(chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"x"}'}}]}))
    out += events.chunk(chunk({}, "tool_calls"))
    out += events.chunk({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}})
    out += events.completed()
    parsed = [EVENTS.validate_python(wire(e)) for e in out]
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    assert [e.type for e in parsed] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed",
    ]
    final = parsed[-1].response
    assert final.output_text == "Let me check."
    call = final.output[1]
    assert call.type == "function_call" and call.call_id == "call_a" and call.arguments == '{"q":"x"}'
    assert [e.output_index for e in parsed if e.type == "response.function_call_arguments.done"] == [1]
    assert final.usage.total_tokens == 12


def test_a_stream_cut_at_the_token_limit_ends_incomplete_and_a_failure_ends_failed():
    cut = ResponseEvents(new_response(request(input="hi", stream=True), "resp_3"))
    cut.started()
    cut.chunk(chunk({"content": "w0 w1"}))
    cut.chunk(chunk({}, "length"))
    ending = cut.completed()[-1]
    assert ending.type == "response.incomplete"
    assert EVENTS.validate_python(wire(ending)).response.incomplete_details.reason == "max_output_tokens"

    failing = ResponseEvents(new_response(request(input="hi", stream=True), "resp_4"))
    failing.started()
    failing.chunk(chunk({"content": "partial"}))
    error, failed = (EVENTS.validate_python(wire(e)) for e in failing.failed(HookError(429, "slow_down", "later"))[-2:])
    assert error.type == "error" and error.code == "slow_down" and error.message == "later"
    assert failed.type == "response.failed" and failed.response.error.code == "rate_limit_exceeded"
    assert failed.response.output_text == "partial"
