"""The Responses API's fields reach the model in their Chat Completions form, and upstream
errors keep their meaning: the openai SDK's `responses.create` against the gateway, the
gateway's agent against a recording upstream (a real HTTP server)."""

from __future__ import annotations

import openai
import pytest

from tests.compat import upstream as up
from tests.compat.conftest import AGENT_RULES, UPSTREAM_MODEL

LOOKUP = {
    "type": "function", "name": "lookup", "description": "Look something up.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}}


def client_for(gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.v1, api_key="sk-any", max_retries=0, timeout=30)


@pytest.mark.parametrize("stream", [False, True])
async def test_every_responses_field_reaches_the_model_under_its_chat_name(upstream_gateway, recording, stream):
    fields = {
        "model": UPSTREAM_MODEL, "input": "hi", "instructions": "Client: answer in French.",
        "temperature": 0.7, "top_p": 0.9, "max_output_tokens": 64, "parallel_tool_calls": False,
        "tools": [LOOKUP], "tool_choice": {"type": "function", "name": "lookup"},
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}},
        "user": "user-1",
    }
    async with client_for(upstream_gateway) as client:
        if stream:
            async with client.responses.stream(**fields) as events:
                response = await events.get_final_response()
        else:
            response = await client.responses.create(**fields)
    assert response.output_text == up.DEFAULT_TEXT
    (sent,) = recording.received
    assert (sent["temperature"], sent["top_p"], sent["max_completion_tokens"]) == (0.7, 0.9, 64)
    assert sent["parallel_tool_calls"] is False and sent["user"] == "user-1"
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    offered = {tool["function"]["name"]: tool["function"] for tool in sent["tools"]}
    assert offered["lookup"] == {k: v for k, v in LOOKUP.items() if k != "type"}
    assert "add" in offered  # the agent's own tool is offered too
    assert sent["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True},
    }
    # the agent's instructions stay first; the response's instructions follow them
    assert sent["messages"] == [
        {"role": "system", "content": f"{AGENT_RULES}\n\nClient: answer in French."},
        {"role": "user", "content": "hi"},
    ]


@pytest.mark.parametrize("stream", [False, True])
async def test_an_upstream_429_stays_a_429_with_its_retry_after(upstream_gateway, recording, stream):
    recording.answer(up.error(429, "Slow down", "rate_limit_exceeded", headers={"Retry-After": "7"}))
    async with client_for(upstream_gateway) as client:
        with pytest.raises(openai.RateLimitError) as caught:
            await client.responses.create(model=UPSTREAM_MODEL, input="hi", stream=stream)
    assert caught.value.status_code == 429
    assert caught.value.response.headers["retry-after"] == "7"
    assert caught.value.code == "rate_limit_exceeded"

