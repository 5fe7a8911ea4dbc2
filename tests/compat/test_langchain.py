"""LangChain's `ChatOpenAI` (`langchain-openai`) against the gateway."""

from __future__ import annotations

import asyncio

import openai
import pytest
from langchain_core.messages import AIMessageChunk, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool as lc_tool
from langchain_openai import ChatOpenAI

from tests.compat import upstream as up
from tests.compat.conftest import AGENT_RULES, UPSTREAM_MODEL


@lc_tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


def chat(gateway, model: str = "offline", **options) -> ChatOpenAI:
    return ChatOpenAI(model=model, base_url=gateway.v1, api_key="sk-any", max_retries=0, **options)


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_server_tool_round_is_one_message_for_langchain(offline_gateway, streamed):
    llm = chat(offline_gateway)
    prompt = [HumanMessage('[[tool:add {"a": 4, "b": 5}]]')]
    if streamed:
        message: AIMessageChunk | None = None
        async for piece in llm.astream(prompt):
            message = piece if message is None else message + piece
        assert message is not None and not message.tool_call_chunks
    else:
        message = await llm.ainvoke(prompt)
    assert message.content == "The tool add returned: 9"
    assert not message.tool_calls
    assert message.response_metadata.get("finish_reason") == "stop"


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_client_tool_round_trip_with_bind_tools(offline_gateway, streamed):
    llm = chat(offline_gateway).bind_tools([lookup])
    messages = [HumanMessage('[[tool:lookup {"q": "rain"}]]')]
    if streamed:
        asked: AIMessageChunk | None = None
        async for piece in llm.astream(messages):
            asked = piece if asked is None else asked + piece
    else:
        asked = await llm.ainvoke(messages)
    assert asked is not None
    assert [(c["name"], c["args"]) for c in asked.tool_calls] == [("lookup", {"q": "rain"})]
    result = await asyncio.to_thread(lookup.invoke, asked.tool_calls[0]["args"])
    messages += [asked, ToolMessage(result, tool_call_id=asked.tool_calls[0]["id"])]
    answer = await llm.ainvoke(messages)
    assert answer.content == "The tool lookup returned: found rain"


async def test_a_mixed_response_for_langchain_keeps_the_server_result(offline_gateway):
    llm = chat(offline_gateway).bind_tools([lookup])
    messages = [HumanMessage('[[tool:add {"a": 5, "b": 5}]] [[tool:lookup {"q": "sun"}]]')]
    asked = await llm.ainvoke(messages)
    assert [c["name"] for c in asked.tool_calls] == ["lookup"]
    messages += [asked, ToolMessage("found sun", tool_call_id=asked.tool_calls[0]["id"])]
    answer = await llm.ainvoke(messages)
    assert answer.content == "The tool add returned: 10\nThe tool lookup returned: found sun"


async def test_langchains_parameters_and_system_message_reach_the_model(upstream_gateway, recording):
    llm = chat(upstream_gateway, UPSTREAM_MODEL, temperature=0.2, top_p=0.6, seed=9, stop=["STOP"], frequency_penalty=0.3)
    answer = await llm.ainvoke([SystemMessage("Client system."), HumanMessage("hi")])
    assert answer.content == up.DEFAULT_TEXT
    sent = recording.received[0]
    assert (sent["temperature"], sent["top_p"], sent["seed"], sent["stop"], sent["frequency_penalty"]) == (
        0.2, 0.6, 9, ["STOP"], 0.3
    )
    assert sent["messages"][0] == {"role": "system", "content": f"{AGENT_RULES}\n\nClient system."}


async def test_langchain_sees_an_upstream_429_as_a_rate_limit(upstream_gateway, recording):
    recording.answer(up.error(429, "Slow down", "rate_limit_exceeded", headers={"Retry-After": "2"}))
    with pytest.raises(openai.RateLimitError) as caught:
        await chat(upstream_gateway, UPSTREAM_MODEL).ainvoke("hi")
    assert caught.value.response.headers["retry-after"] == "2"


@lc_tool
def other(q: str) -> str:
    """Another lookup."""
    return f"other {q}"


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"tool_choice": "other"}, ["other"]),
        ({"tool_choice": "none"}, []),
        ({}, ["lookup", "lookup"]),
        ({"parallel_tool_calls": False}, ["lookup"]),
    ],
)
async def test_bind_tools_tool_choice_and_parallel_tool_calls_are_honoured(offline_gateway, options, expected):
    content = "no directive" if "tool_choice" in options else '[[tool:lookup {"q": "a"}]] [[tool:lookup {"q": "b"}]]'
    asked = await chat(offline_gateway).bind_tools([lookup, other], **options).ainvoke(content)
    assert [c["name"] for c in asked.tool_calls] == expected
    assert asked.response_metadata["finish_reason"] == ("tool_calls" if expected else "stop")
