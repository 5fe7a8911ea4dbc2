"""The offline model, exercised the way the agent uses it: the real openai client over HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlparse

import httpx
import openai
import pytest
from openai import AsyncOpenAI
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessageFunctionToolCall,
)

from hookbus.services.testing.offline_model import (
    Message,
    count_tokens,
    parse_directives,
    prompt_tokens,
    split_words,
)
from hookbus.services.testing.offline_server import (
    OFFLINE_API_KEY,
    OfflineModelServer,
    shared_offline_base_url,
)
from tests.waiting import wait_for

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CLOCK_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}


def user(text: str) -> Any:
    """A user message (typed Any: the openai client's message TypedDicts are not worth it here)."""
    return {"role": "user", "content": text}


@pytest.fixture(scope="module")
def server() -> Iterator[OfflineModelServer]:
    with OfflineModelServer() as running:
        yield running


@pytest.fixture
async def client(server: OfflineModelServer) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=server.base_url, api_key=OFFLINE_API_KEY, max_retries=0) as api:
        yield api


@pytest.fixture
async def raw(server: OfflineModelServer) -> AsyncIterator[httpx.AsyncClient]:
    """A plain HTTP client, for what the openai client would refuse to send or hides."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as http:
        yield http


async def ask(client: AsyncOpenAI, *messages: Any, **kwargs: Any) -> ChatCompletion:
    kwargs.setdefault("model", "offline")
    completion: ChatCompletion = await client.chat.completions.create(
        messages=list(messages), **kwargs
    )
    return completion


async def ask_stream(
    client: AsyncOpenAI, *messages: Any, **kwargs: Any
) -> list[ChatCompletionChunk]:
    kwargs.setdefault("model", "offline")
    stream: Any = await client.chat.completions.create(
        messages=list(messages), stream=True, **kwargs
    )
    return [chunk async for chunk in stream]


def streamed_text(chunks: list[ChatCompletionChunk]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def reassemble_tool_calls(chunks: list[ChatCompletionChunk]) -> list[dict[str, str]]:
    """Tool calls put back together from their deltas, as a streaming client must."""
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            if delta.id:
                call["id"] = delta.id
            if delta.function and delta.function.name:
                call["name"] += delta.function.name
            if delta.function and delta.function.arguments:
                call["arguments"] += delta.function.arguments
    return [calls[i] for i in sorted(calls)]


def calls_of(completion: ChatCompletion) -> list[ChatCompletionMessageFunctionToolCall]:
    """The function tool calls of a completion (the offline model makes no other kind)."""
    calls = completion.choices[0].message.tool_calls or []
    assert all(isinstance(call, ChatCompletionMessageFunctionToolCall) for call in calls)
    return [call for call in calls if isinstance(call, ChatCompletionMessageFunctionToolCall)]


def assistant_turn(completion: ChatCompletion) -> dict[str, Any]:
    """The assistant message of a completion, ready to send back in the next request."""
    return completion.choices[0].message.model_dump(exclude_none=True)


def tool_result(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


# --------------------------------------------------------------------------- plain answers


async def test_plain_answer(client: AsyncOpenAI) -> None:
    completion = await ask(client, {"role": "system", "content": "Be brief."}, user("Hello there"))

    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "Offline model reply to: Hello there"
    assert choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    assert completion.object == "chat.completion"
    assert completion.model == "offline"
    assert completion.id.startswith("chatcmpl-offline-")


async def test_plain_answer_quotes_only_the_first_80_chars(client: AsyncOpenAI) -> None:
    text = "x" * 50 + " " + "y" * 100
    completion = await ask(client, user(text))
    assert completion.choices[0].message.content == "Offline model reply to: " + text[:80]


async def test_usage_counts_tokens_of_messages_and_answer(client: AsyncOpenAI) -> None:
    completion = await ask(client, {"role": "system", "content": "Be brief."}, user("Hello there"))

    answer = "Offline model reply to: Hello there"
    usage = completion.usage
    assert usage is not None
    assert usage.prompt_tokens == count_tokens("Be brief.") + count_tokens("Hello there") + 2 * 4
    assert usage.completion_tokens == count_tokens(answer)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


async def test_content_given_as_parts_is_read(client: AsyncOpenAI) -> None:
    completion = await ask(
        client, {"role": "user", "content": [{"type": "text", "text": "parts work"}]}
    )
    assert completion.choices[0].message.content == "Offline model reply to: parts work"


async def test_unknown_openai_fields_are_ignored(client: AsyncOpenAI) -> None:
    completion = await ask(
        client,
        user("hi"),
        temperature=0.2,
        max_tokens=5,
        seed=7,
        user="someone",
        extra_body={"brand_new_field": {"x": 1}},
    )
    assert completion.choices[0].message.content == "Offline model reply to: hi"


# --------------------------------------------------------------------------- streaming


async def test_stream_chunks_role_words_finish(client: AsyncOpenAI) -> None:
    chunks = await ask_stream(client, user("stream this please"))

    first, *middle, last = chunks
    assert first.choices[0].delta.role == "assistant"
    assert first.choices[0].delta.content == ""
    assert [c.choices[0].delta.content for c in middle] == [
        "Offline",
        " model",
        " reply",
        " to:",
        " stream",
        " this",
        " please",
    ]
    assert last.choices[0].finish_reason == "stop"
    assert last.choices[0].delta.content is None and last.choices[0].delta.tool_calls is None
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-offline-")
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert {c.model for c in chunks} == {"offline"}
    assert all(c.usage is None for c in chunks)


async def test_stream_and_non_stream_agree(client: AsyncOpenAI) -> None:
    messages = [user("same answer either way")]
    completion = await ask(client, *messages)
    chunks = await ask_stream(client, *messages)
    assert streamed_text(chunks) == completion.choices[0].message.content
    assert chunks[0].id == completion.id


async def test_stream_usage_chunk_when_asked(client: AsyncOpenAI) -> None:
    chunks = await ask_stream(client, user("count me"), stream_options={"include_usage": True})
    completion = await ask(client, user("count me"))

    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage == completion.usage
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks[:-1])


async def test_a_stream_whose_client_left_stops(raw: httpx.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    """The model's thread serves every caller of the process: a stream must stop once its
    client is gone, not write the rest of a 100,000-chunk answer into the dead socket
    (asyncio logs each such write) before it serves anyone else."""
    body = {"model": "offline", "messages": [user("[[words:100000]]")], "stream": True}
    async with raw.stream("POST", "/chat/completions", json=body) as response:
        lines = response.aiter_lines()
        for _ in range(3):
            await anext(lines)
    await raw.aclose()  # the connection is gone
    async with httpx.AsyncClient(base_url=str(raw.base_url), timeout=30) as other:
        answer = await other.post("/chat/completions", json={"model": "offline", "messages": [user("next")]})
    assert answer.status_code == 200
    dead_writes = [r for r in caplog.records if r.getMessage() == "socket.send() raised exception."]
    assert len(dead_writes) < 10, len(dead_writes)


async def test_sse_framing_is_openai_style(raw: httpx.AsyncClient) -> None:
    body = {"model": "offline", "messages": [user("[[words:2]]")], "stream": True}
    async with raw.stream("POST", "/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        text = "".join([part async for part in response.aiter_text()])

    events = text.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(event.removeprefix("data: ")) for event in events[:-2]]
    assert all(event.startswith("data: {") for event in events[:-2])
    assert [p["choices"][0]["delta"] for p in payloads] == [
        {"role": "assistant", "content": ""},
        {"content": "w0"},
        {"content": " w1"},
        {},
    ]


# --------------------------------------------------------------------------- tool calls


async def test_tool_call(client: AsyncOpenAI) -> None:
    completion = await ask(
        client, user('Weather? [[tool:get_weather {"city": "Paris"}]]'), tools=[WEATHER_TOOL]
    )

    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = calls_of(completion)
    assert re.fullmatch(r"call_[0-9a-f]+", call.id)
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert completion.usage is not None
    assert completion.usage.completion_tokens == count_tokens(call.function.arguments)


async def test_tool_call_without_arguments_gets_empty_object(client: AsyncOpenAI) -> None:
    completion = await ask(client, user("[[tool:get_time]]"), tools=[CLOCK_TOOL])
    (call,) = calls_of(completion)
    assert call.function.name == "get_time"
    assert json.loads(call.function.arguments) == {}


async def test_tool_call_stream(client: AsyncOpenAI) -> None:
    chunks = await ask_stream(
        client,
        user('[[tool:get_weather {"city": "Paris", "days": [1, 2, 3]}]]'),
        tools=[WEATHER_TOOL],
        stream_options={"include_usage": True},
    )

    assert chunks[0].choices[0].delta.role == "assistant"
    tool_deltas = [
        delta
        for chunk in chunks
        if chunk.choices
        for delta in chunk.choices[0].delta.tool_calls or []
    ]
    head, *pieces = tool_deltas
    assert head.index == 0 and head.id and head.type == "function"
    assert head.function is not None and head.function.name == "get_weather"
    assert head.function.arguments == ""
    assert len(pieces) >= 2
    assert all(p.id is None and p.function and p.function.name is None for p in pieces)

    (call,) = reassemble_tool_calls(chunks)
    assert json.loads(call["arguments"]) == {"city": "Paris", "days": [1, 2, 3]}
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == count_tokens(call["arguments"])

    completion = await ask(
        client,
        user('[[tool:get_weather {"city": "Paris", "days": [1, 2, 3]}]]'),
        tools=[WEATHER_TOOL],
    )
    assert call["id"] == calls_of(completion)[0].id


async def test_several_tool_calls_in_one_response(client: AsyncOpenAI) -> None:
    text = '[[tool:get_time]] and [[tool:get_weather {"city": "Oslo"}]]'
    completion = await ask(client, user(text), tools=[WEATHER_TOOL, CLOCK_TOOL])
    calls = calls_of(completion)
    assert [c.function.name for c in calls] == ["get_time", "get_weather"]
    assert len({c.id for c in calls}) == 2

    streamed = reassemble_tool_calls(
        await ask_stream(client, user(text), tools=[WEATHER_TOOL, CLOCK_TOOL])
    )
    assert [(c["id"], c["name"], json.loads(c["arguments"])) for c in streamed] == [
        (calls[0].id, "get_time", {}),
        (calls[1].id, "get_weather", {"city": "Oslo"}),
    ]


async def test_tool_directive_for_a_tool_not_offered_answers_text(client: AsyncOpenAI) -> None:
    completion = await ask(client, user("hi [[tool:get_weather]]"), tools=[CLOCK_TOOL])
    assert completion.choices[0].message.tool_calls is None
    assert completion.choices[0].message.content == "Offline model reply to: hi"

    no_tools = await ask(client, user("hi [[tool:get_weather]]"))
    assert no_tools.choices[0].message.content == "Offline model reply to: hi"


async def test_tool_choice_none_means_no_tool_calls(client: AsyncOpenAI) -> None:
    completion = await ask(
        client, user("[[tool:get_time]]"), tools=[CLOCK_TOOL], tool_choice="none"
    )
    assert completion.choices[0].finish_reason == "stop"


async def test_malformed_tool_arguments_pass_through_verbatim(client: AsyncOpenAI) -> None:
    completion = await ask(client, user("[[tool:get_weather {city: Paris]]"), tools=[WEATHER_TOOL])
    (call,) = calls_of(completion)
    assert call.function.arguments == "{city: Paris"


async def test_follow_up_after_tool_result(client: AsyncOpenAI) -> None:
    question = user('[[tool:get_weather {"city": "Paris"}]]')
    first = await ask(client, question, tools=[WEATHER_TOOL])
    call = calls_of(first)[0]

    follow_up = [question, assistant_turn(first), tool_result(call.id, "sunny, 21C")]
    second = await ask(client, *follow_up, tools=[WEATHER_TOOL])

    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.tool_calls is None
    assert second.choices[0].message.content == "The tool get_weather returned: sunny, 21C"
    chunks = await ask_stream(client, *follow_up, tools=[WEATHER_TOOL])
    assert streamed_text(chunks) == "The tool get_weather returned: sunny, 21C"


async def test_follow_up_truncates_long_tool_results(client: AsyncOpenAI) -> None:
    question = user("[[tool:get_time]]")
    first = await ask(client, question, tools=[CLOCK_TOOL])
    call = calls_of(first)[0]
    long_result = "0123456789" * 50

    second = await ask(client, question, assistant_turn(first), tool_result(call.id, long_result))
    assert second.choices[0].message.content == "The tool get_time returned: " + long_result[:200]


async def test_follow_up_after_several_tool_results(client: AsyncOpenAI) -> None:
    question = user("[[tool:get_time]] [[tool:get_weather]]")
    first = await ask(client, question, tools=[WEATHER_TOOL, CLOCK_TOOL])
    time_call, weather_call = calls_of(first)

    second = await ask(
        client,
        question,
        assistant_turn(first),
        tool_result(time_call.id, "noon"),
        tool_result(weather_call.id, "rain"),
        tools=[WEATHER_TOOL, CLOCK_TOOL],
    )
    assert second.choices[0].message.content == (
        "The tool get_time returned: noon\nThe tool get_weather returned: rain"
    )


async def test_loop_directive_keeps_calling_until_tools_are_withdrawn(client: AsyncOpenAI) -> None:
    messages: list[dict[str, Any]] = [user("[[loop:get_time]]")]
    for expected_n in range(3):
        completion = await ask(client, *messages, tools=[CLOCK_TOOL])
        (call,) = calls_of(completion)
        assert call.function.name == "get_time"
        assert json.loads(call.function.arguments) == {"n": expected_n}
        messages += [assistant_turn(completion), tool_result(call.id, f"tick {expected_n}")]

    final = await ask(client, *messages)
    assert final.choices[0].message.content == "Final answer after 3 tool calls."
    streamed = await ask_stream(client, *messages)
    assert streamed_text(streamed) == "Final answer after 3 tool calls."


# --------------------------------------------------------------------------- directives


async def test_words_directive(client: AsyncOpenAI) -> None:
    completion = await ask(client, user("[[words:4]]"))
    assert completion.choices[0].message.content == "w0 w1 w2 w3"

    chunks = await ask_stream(client, user("[[words:4]]"))
    assert [c.choices[0].delta.content for c in chunks[1:-1]] == ["w0", " w1", " w2", " w3"]

    empty = await ask(client, user("[[words:0]]"))
    assert empty.choices[0].message.content == ""


async def test_echo_directive(client: AsyncOpenAI) -> None:
    completion = await ask(client, user("Say [[echo]] exactly\nthis [[delay:1]]"))
    assert completion.choices[0].message.content == "Say exactly\nthis"


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (400, openai.BadRequestError),
        (401, openai.AuthenticationError),
        (429, openai.RateLimitError),
        (500, openai.InternalServerError),
        (503, openai.InternalServerError),
    ],
)
async def test_error_directive(
    client: AsyncOpenAI, status: int, error_class: type[openai.APIStatusError]
) -> None:
    with pytest.raises(error_class) as caught:
        await ask(client, user(f"fail please [[error:{status}]]"))
    assert caught.value.status_code == status
    assert caught.value.body == {
        "message": "offline model: simulated error",
        "type": caught.value.type,
        "param": None,
        "code": "simulated_error",
    }

    with pytest.raises(error_class):
        await ask_stream(client, user(f"fail please [[error:{status}]]"))


async def test_error_directive_needs_an_error_status(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="between 400 and 599"):
        await ask(client, user("[[error:200]]"))


async def test_delay_directive_non_stream(client: AsyncOpenAI) -> None:
    started = time.perf_counter()
    completion = await ask(client, user("[[delay:200]] slow"))
    assert time.perf_counter() - started >= 0.2
    assert completion.choices[0].message.content == "Offline model reply to: slow"


async def test_delay_directive_applies_before_each_chunk(client: AsyncOpenAI) -> None:
    stream: Any = await client.chat.completions.create(
        model="offline", messages=[user("[[delay:60]] [[words:3]]")], stream=True
    )
    arrivals = []
    started = time.perf_counter()
    async for _chunk in stream:
        arrivals.append(time.perf_counter() - started)
    assert len(arrivals) == 5  # role, three words, finish
    gaps = [later - earlier for earlier, later in zip(arrivals, arrivals[1:], strict=False)]
    assert all(gap >= 0.04 for gap in gaps)
    assert arrivals[-1] >= 0.2


async def test_delay_directive_also_delays_a_simulated_error(client: AsyncOpenAI) -> None:
    started = time.perf_counter()
    with pytest.raises(openai.InternalServerError):
        await ask(client, user("[[delay:150]] [[error:500]]"))
    assert time.perf_counter() - started >= 0.15


async def test_summary_from_system_marker(client: AsyncOpenAI) -> None:
    completion = await ask(
        client,
        {"role": "system", "content": "[[summarize]] Summarize the conversation.\nFocus: the trip"},
        user("I want to fly to Lisbon next week, somewhere near the sea please"),
        {"role": "assistant", "content": "Sure.\nWhich   dates?"},
        user("Monday [[error:500]] to Friday"),
    )
    assert completion.choices[0].message.content == (
        "Summary: Focus: the trip. "
        "user: I want to fly to Lisbon next week, somew; "
        "assistant: Sure. Which dates?; "
        "user: Monday [[error:500]] to Friday"
    )


async def test_the_compaction_prompt_is_a_summary_request_without_any_directive(client: AsyncOpenAI) -> None:
    from hookbus.services.orchestrator.compaction.rules import summary_request

    conversation = [
        {"role": "user", "content": "Plan a trip to Lisbon [[words:3]]"},
        {"role": "assistant", "content": "Which dates?"},
    ]
    request = summary_request(conversation, limit=200, focus="the dates")
    assert "[[" not in request[0]["content"]
    completion = await ask(client, *request)
    assert (completion.choices[0].message.content or "").startswith("Summary: Focus: the dates. user: ")


async def test_summary_from_user_marker_leaves_the_instruction_out(client: AsyncOpenAI) -> None:
    question = user("[[tool:get_time]]")
    first = await ask(client, question, tools=[CLOCK_TOOL])
    call = calls_of(first)[0]

    completion = await ask(
        client,
        {"role": "system", "content": "You are helpful."},
        question,
        assistant_turn(first),
        tool_result(call.id, "noon"),
        user("[[summarize]] please"),
    )
    assert completion.choices[0].message.content == (
        "Summary: user: [[tool:get_time]]; assistant: [tool calls: get_time]; tool: noon"
    )


async def test_summary_is_capped_at_400_words(client: AsyncOpenAI) -> None:
    chatter = [user("one two three four five six seven eight nine ten") for _ in range(100)]
    completion = await ask(client, {"role": "system", "content": "[[summarize]]"}, *chatter)
    content = completion.choices[0].message.content or ""
    assert content.startswith("Summary: user: one two")
    assert len(content.split()) <= 401


# --------------------------------------------------------------------------- errors


async def test_unknown_model_is_404(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await ask(client, user("hi"), model="gpt-9")
    assert caught.value.code == "model_not_found"
    assert "gpt-9" in caught.value.message


async def test_context_window_is_enforced(client: AsyncOpenAI) -> None:
    long_text = "hello " * 2000
    expected_tokens = prompt_tokens([Message(role="user", content=long_text)])
    assert expected_tokens > 1024

    with pytest.raises(openai.BadRequestError) as caught:
        await ask(client, user(long_text), model="offline-tiny")
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.body["message"].startswith(  # type: ignore[index]
        "This model's maximum context length is 1024 tokens. "
        f"However, your messages resulted in {expected_tokens} tokens."
    )
    with pytest.raises(openai.BadRequestError, match="4096 tokens"):
        await ask_stream(client, user(long_text * 3), model="offline-small")

    completion = await ask(client, user(long_text), model="offline")
    assert completion.usage is not None and completion.usage.prompt_tokens == expected_tokens


async def test_small_models_answer_small_prompts(client: AsyncOpenAI) -> None:
    for model in ("offline-small", "offline-tiny"):
        completion = await ask(client, user("hi"), model=model)
        assert completion.model == model


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [user("hi")]}, "model"),
        ({"model": "offline"}, "messages"),
        ({"model": "offline", "messages": []}, "messages"),
        ({"model": "offline", "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ({"model": "offline", "messages": [user("x")], "stream": "very"}, "stream"),
        (["not", "an", "object"], None),
    ],
)
async def test_invalid_body_is_400_with_openai_error(
    raw: httpx.AsyncClient, body: Any, param: str | None
) -> None:
    response = await raw.post("/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


async def test_body_that_is_not_json_is_400(raw: httpx.AsyncClient) -> None:
    response = await raw.post(
        "/chat/completions", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"


async def test_invalid_role_through_the_client(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        await ask(client, {"role": "wizard", "content": "abracadabra"})


async def test_tool_messages_must_answer_tool_calls(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="role 'tool'"):
        await ask(client, user("hi"), tool_result("call_nobody", "orphan"))

    first = await ask(client, user("[[tool:get_time]]"), tools=[CLOCK_TOOL])
    with pytest.raises(openai.BadRequestError, match="did not have response messages"):
        await ask(client, user("[[tool:get_time]]"), assistant_turn(first), user("and?"))


async def test_unknown_path_answers_in_openai_error_shape(raw: httpx.AsyncClient) -> None:
    response = await raw.get("/nothing-here")
    assert response.status_code == 404
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


# --------------------------------------------------------------------------- determinism


def _without_created(value: dict[str, Any]) -> dict[str, Any]:
    return {key: item for key, item in value.items() if key != "created"}


async def test_same_request_same_response(client: AsyncOpenAI) -> None:
    messages = [user('[[tool:get_weather {"city": "Rome"}]] [[tool:get_time]]')]
    first = await ask(client, *messages, tools=[WEATHER_TOOL, CLOCK_TOOL])
    second = await ask(client, *messages, tools=[WEATHER_TOOL, CLOCK_TOOL])
    assert _without_created(first.model_dump()) == _without_created(second.model_dump())

    stream_a = await ask_stream(client, user("stable please"))
    stream_b = await ask_stream(client, user("stable please"))
    assert [_without_created(c.model_dump()) for c in stream_a] == [
        _without_created(c.model_dump()) for c in stream_b
    ]


async def test_different_requests_get_different_ids(client: AsyncOpenAI) -> None:
    one = await ask(client, user("[[tool:get_time]]"), tools=[CLOCK_TOOL])
    two = await ask(client, user("[[tool:get_time]] again"), tools=[CLOCK_TOOL])
    assert one.id != two.id
    assert calls_of(one)[0].id != calls_of(two)[0].id


# --------------------------------------------------------------------------- models


async def test_list_models(client: AsyncOpenAI) -> None:
    page = await client.models.list()
    cards = {model.id: model for model in page.data}
    assert set(cards) == {"offline", "offline-small", "offline-tiny"}
    assert all(card.object == "model" for card in cards.values())
    assert (cards["offline-small"].model_extra or {})["context_window"] == 4096


async def test_retrieve_model(client: AsyncOpenAI) -> None:
    model = await client.models.retrieve("offline-tiny")
    assert model.id == "offline-tiny"
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("gpt-9")


# --------------------------------------------------------------------------- pure helpers


def test_parse_directives() -> None:
    parsed = parse_directives(
        'a [[tool:x {"q": "]]"}]] b [[words:3]] [[delay:25]] [[echo]] [[loop:y]] [[summarize]]'
    )
    assert parsed.text == "a b"
    assert [(t.name, json.loads(t.arguments)) for t in parsed.tools] == [("x", {"q": "]]"})]
    assert (parsed.words, parsed.delay_ms, parsed.loop) == (3, 25, "y")
    assert parsed.echo and parsed.summarize and parsed.error is None


def test_unknown_or_unclosed_brackets_stay_text() -> None:
    parsed = parse_directives("[[nope]] [[tool:x {")
    assert parsed.text == "[[nope]] [[tool:x {"
    assert parsed.tools == ()


def test_split_words_joins_back() -> None:
    for text in ("", "one", " lead", "a  b\nc ", "   "):
        assert "".join(split_words(text)) == text


# --------------------------------------------------------------------------- the server


def _accepts_connections(base_url: str) -> bool:
    address = urlparse(base_url)
    try:
        with socket.create_connection((address.hostname, address.port), timeout=0.5):
            return True
    except OSError:
        return False


def test_server_starts_fast_and_stops() -> None:
    server = OfflineModelServer()
    started = time.perf_counter()
    base_url = server.start()
    elapsed = time.perf_counter() - started
    try:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", base_url)
        assert elapsed < 0.5
        assert server.start() == base_url  # already running: same server
        assert _accepts_connections(base_url)
    finally:
        server.stop()
    assert not server.running
    assert not _accepts_connections(base_url)
    with pytest.raises(RuntimeError):
        _ = server.base_url


async def test_stop_cuts_a_stream_in_progress() -> None:
    server = OfflineModelServer()
    base_url = server.start()
    try:
        async with AsyncOpenAI(base_url=base_url, api_key=OFFLINE_API_KEY, max_retries=0) as api:
            stream: Any = await api.chat.completions.create(
                model="offline", messages=[user("[[delay:300]] [[words:100]]")], stream=True
            )
            received: list[Any] = []
            consumer = asyncio.create_task(_drain(stream, received))

            async def streaming() -> bool:
                return bool(received)

            assert await wait_for(streaming, timeout=5)
            started = time.perf_counter()
            await asyncio.to_thread(server.stop)
            assert time.perf_counter() - started < 3
            with pytest.raises(openai.APIError):
                await asyncio.wait_for(consumer, 5)
    finally:
        server.stop()


async def _drain(stream: Any, received: list[Any]) -> int:
    async for chunk in stream:
        received.append(chunk)
    return len(received)


def test_servers_side_by_side_get_their_own_ports() -> None:
    with OfflineModelServer() as one, OfflineModelServer() as two:
        assert one.base_url != two.base_url


def test_server_can_be_restarted() -> None:
    server = OfflineModelServer()
    try:
        server.start()
        server.stop()
        assert _accepts_connections(server.start())
    finally:
        server.stop()


async def _answer_via(base_url: str) -> str | None:
    async with AsyncOpenAI(base_url=base_url, api_key=OFFLINE_API_KEY, max_retries=0) as api:
        completion = await api.chat.completions.create(model="offline", messages=[user("ping")])
    return completion.choices[0].message.content


def test_shared_server_is_one_per_process_and_serves_any_event_loop() -> None:
    urls: list[str] = []
    answers: list[str | None] = []

    def worker() -> None:
        url = shared_offline_base_url()
        urls.append(url)
        answers.append(asyncio.run(_answer_via(url)))  # a fresh event loop per thread

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)

    assert len(urls) == 4 and len(set(urls)) == 1
    assert urls[0] == shared_offline_base_url()
    assert answers == ["Offline model reply to: ping"] * 4


async def test_shared_server_from_the_running_loop() -> None:
    assert await _answer_via(shared_offline_base_url()) == "Offline model reply to: ping"


def test_the_offline_model_is_announced_once_when_used() -> None:
    import subprocess
    import sys

    script = (
        "import asyncio\n"
        "from hookbus import Agent\n"
        "async def main():\n"
        "    for name in ('a', 'b'):\n"
        "        await Agent(name).run('hello')\n"
        "asyncio.run(main())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_BASE_URL"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60, check=True
    )
    output = done.stdout + done.stderr
    assert output.count("offline_model_in_use") == 1, output
    assert "not an AI" in output
