"""The official `openai` SDK against the gateway: one turn, client tools, tool_choice, instructions."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from hookbus.services.gateway.models import MODEL_CREATED
from tests.compat.conftest import function_tool

ADD_TWICE = '[[tool:add {"a": 1, "b": 2}]] [[tool:add {"a": 3, "b": 4}]]'
LOOKUP = function_tool("lookup")


def client_for(gateway, max_retries: int = 0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.v1, api_key="sk-any", max_retries=max_retries, timeout=30)


async def test_a_streamed_server_tool_round_is_one_assistant_turn(offline_gateway):
    async with client_for(offline_gateway) as client:
        stream = await client.chat.completions.create(
            model="offline", messages=[{"role": "user", "content": ADD_TWICE}], stream=True
        )
        chunks = [c async for c in stream]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sum(1 for d in deltas if d.role) == 1 and deltas[0].role == "assistant"
    assert all(not d.tool_calls for d in deltas)
    assert finishes == ["stop"]
    text = "".join(d.content or "" for d in deltas)
    assert text == "The tool add returned: 3\nThe tool add returned: 7"


async def test_a_streamed_server_tool_shows_its_progress_as_sse_comments(offline_gateway):
    body = {"model": "offline", "stream": True, "messages": [{"role": "user", "content": ADD_TWICE}]}
    async with httpx.AsyncClient(timeout=30) as http, http.stream(
        "POST", f"{offline_gateway.v1}/chat/completions", json=body
    ) as response:
        lines = [line async for line in response.aiter_lines() if line]
    comments = [line for line in lines if line.startswith(":")]
    assert comments == [": hookbus: tool add running", ": hookbus: tool add done"] * 2
    assert lines[-1] == "data: [DONE]"


async def test_a_non_streamed_server_tool_round_is_one_answer(offline_gateway):
    async with client_for(offline_gateway) as client:
        completion = await client.chat.completions.create(
            model="offline", messages=[{"role": "user", "content": ADD_TWICE}]
        )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.content == "The tool add returned: 3\nThe tool add returned: 7"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_tool_call_is_returned_and_its_result_continues_the_turn(offline_gateway, stream):
    messages = [{"role": "user", "content": '[[tool:lookup {"q": "weather"}]]'}]
    async with client_for(offline_gateway) as client:
        calls, finish = await _ask(client, messages, [LOOKUP], stream)
        assert finish == "tool_calls"
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
            ("lookup", {"q": "weather"})
        ]
        messages += [
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": "sunny"},
        ]
        answer = await client.chat.completions.create(model="offline", messages=messages, tools=[LOOKUP])
    assert answer.choices[0].message.content == "The tool lookup returned: sunny"
    assert answer.choices[0].finish_reason == "stop"


async def _ask(client, messages, tools, stream, **options):
    """The tool calls returned and the finish_reason, streamed or not."""
    if not stream:
        completion = await client.chat.completions.create(model="offline", messages=messages, tools=tools, **options)
        choice = completion.choices[0]
        return [c.model_dump(exclude_none=True) for c in choice.message.tool_calls or ()], choice.finish_reason
    response = await client.chat.completions.create(
        model="offline", messages=messages, tools=tools, stream=True, **options
    )
    calls: dict[int, dict] = {}
    finishes = []
    async for chunk in response:
        for choice in chunk.choices:
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
            for delta in choice.delta.tool_calls or ():
                slot = calls.setdefault(delta.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                slot["id"] = delta.id or slot["id"]
                slot["function"]["name"] += delta.function.name or ""
                slot["function"]["arguments"] += delta.function.arguments or ""
    assert len(finishes) == 1
    return [calls[i] for i in sorted(calls)], finishes[0]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_mixed_response_runs_the_server_call_returns_the_client_call_and_keeps_every_result(
    offline_gateway, stream
):
    messages = [{"role": "user", "content": '[[tool:add {"a": 20, "b": 22}]] [[tool:lookup {"q": "x"}]]'}]
    async with client_for(offline_gateway) as client:
        calls, finish = await _ask(client, messages, [LOOKUP], stream)
        assert finish == "tool_calls" and [c["function"]["name"] for c in calls] == ["lookup"]
        messages += [
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": "found"},
        ]
        answer = await client.chat.completions.create(model="offline", messages=messages, tools=[LOOKUP])
    # the model saw the server's result (held and spliced back) and the client's
    assert answer.choices[0].message.content == "The tool add returned: 42\nThe tool lookup returned: found"


async def test_before_toolcall_blocks_a_client_call_and_the_model_is_told(offline_gateway):
    async with client_for(offline_gateway) as client:
        completion = await client.chat.completions.create(
            model="offline", messages=[{"role": "user", "content": "[[tool:forbidden]]"}],
            tools=[function_tool("forbidden")],
        )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert "not allowed" in (choice.message.content or "")


async def test_before_toolcall_rewrites_a_client_call_before_it_is_returned(offline_gateway):
    async with client_for(offline_gateway) as client:
        calls, _ = await _ask(client, [{"role": "user", "content": '[[tool:lookup {"q": "rewrite-me"}]]'}], [LOOKUP], True)
    assert json.loads(calls[0]["function"]["arguments"]) == {"q": "rewritten"}


async def test_a_client_tool_overrides_the_agent_tool_of_the_same_name(offline_gateway):
    async with client_for(offline_gateway) as client:
        calls, finish = await _ask(client, [{"role": "user", "content": '[[tool:add {"a": 1, "b": 1}]]'}], [function_tool("add")], False)
    assert finish == "tool_calls" and calls[0]["function"]["name"] == "add"


@pytest.mark.parametrize(
    ("tool_choice", "expected"),
    [
        ({"type": "function", "function": {"name": "other"}}, ["other"]),
        ("none", []),
        ("auto", []),
    ],
)
async def test_tool_choice_is_honoured(offline_gateway, tool_choice, expected):
    async with client_for(offline_gateway) as client:
        calls, finish = await _ask(
            client, [{"role": "user", "content": "no directive here"}], [LOOKUP, function_tool("other")], False,
            tool_choice=tool_choice,
        )
    assert [c["function"]["name"] for c in calls] == expected
    assert finish == ("tool_calls" if expected else "stop")


async def test_tool_choice_required_makes_the_model_call_a_tool_on_the_first_round_only(offline_gateway):
    # the offline model calls the first offered tool, the agent's own `add`, which runs on the
    # server; the next round gets "auto", so the turn ends in text instead of looping
    async with client_for(offline_gateway) as client:
        completion = await client.chat.completions.create(
            model="offline", messages=[{"role": "user", "content": "no directive here"}],
            tools=[LOOKUP], tool_choice="required",
        )
    assert completion.choices[0].finish_reason == "stop"
    assert (completion.choices[0].message.content or "").startswith("The tool add returned: Error")


async def test_parallel_tool_calls_false_gets_one_call(offline_gateway):
    content = '[[tool:lookup {"q": "a"}]] [[tool:lookup {"q": "b"}]]'
    async with client_for(offline_gateway) as client:
        both, _ = await _ask(client, [{"role": "user", "content": content}], [LOOKUP], False)
        one, _ = await _ask(client, [{"role": "user", "content": content}], [LOOKUP], False, parallel_tool_calls=False)
    assert len(both) == 2 and len(one) == 1


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [("temperature", 5, "temperature"), ("n", 0, "n"), ("top_p", 2, "top_p"), ("stop", ["a"] * 5, "stop"),
     ("response_format", {"type": "xml"}, "response_format"), ("tool_choice", "sometimes", "tool_choice"),
     ("tool_choice", {"type": "allowed_tools", "allowed_tools": {"mode": "sometimes", "tools": []}}, "tool_choice")],
)
async def test_invalid_values_get_openais_400(offline_gateway, field, value, param):
    async with client_for(offline_gateway) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="offline", messages=[{"role": "user", "content": "hi"}], **{field: value}
            )
    assert caught.value.status_code == 400
    assert caught.value.body["param"].startswith(param)


async def test_n_above_one_is_refused_with_the_reason(offline_gateway):
    async with client_for(offline_gateway) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="offline", messages=[{"role": "user", "content": "hi"}], n=2)
    assert "n=2 is not supported" in caught.value.message
    assert caught.value.body["param"] == "n"


async def test_the_model_list_names_the_served_model_with_a_stable_created(offline_gateway):
    async with client_for(offline_gateway) as client:
        listed = [card async for card in client.models.list()]
        one = await client.models.retrieve("offline")
    assert [(c.id, c.created) for c in listed] == [("offline", MODEL_CREATED)]
    assert one.created == MODEL_CREATED  # the same from every gateway replica and restart
