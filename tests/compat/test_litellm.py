"""litellm (`litellm.acompletion`, model `openai/<name>`, `api_base` at the gateway).

litellm is a completion library: it runs no tools, so the client tool round trip is the
caller's, as with the openai SDK. Only the async API is used: the stack runs in the
test's event loop, which a blocking `litellm.completion` would stop.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from tests.compat import upstream as up
from tests.compat.conftest import (
    AGENT_RULES,
    TOOL_CHOICE_CASES,
    UPSTREAM_MODEL,
    function_tool,
    tool_choice_prompt,
)

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of litellm's price list
import litellm  # noqa: E402 - after the setting above

litellm.suppress_debug_info = True  # no "Provider List" banner on each expected error
# pydantic's notes on litellm's own TypedDicts, made when litellm first builds its models
pytestmark = pytest.mark.filterwarnings("ignore:.*ReadOnly.*:UserWarning")
LOOKUP = function_tool("lookup")


async def complete(gateway, messages: list[dict[str, Any]], model: str = "offline", stream: bool = False, **options: Any):
    """litellm's answer as one ModelResponse (a stream assembled by litellm's own builder),
    and the finish reasons the stream carried (one for a non-streamed answer)."""
    response = await litellm.acompletion(
        model=f"openai/{model}", api_base=gateway.v1, api_key="sk-any", messages=messages,
        stream=stream, max_retries=0, num_retries=0, **options,
    )
    if not stream:
        return response, [response.choices[0].finish_reason]
    chunks = [chunk async for chunk in response]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return litellm.stream_chunk_builder(chunks, messages=messages), finishes


def user(content: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


def calls_of(response) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
        for c in response.choices[0].message.tool_calls or ()
    ]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_server_tool_round_is_one_answer_for_litellm(offline_gateway, stream):
    answer, finishes = await complete(offline_gateway, user('[[tool:add {"a": 1, "b": 2}]] [[tool:add {"a": 3, "b": 4}]]'), stream=stream)
    assert finishes == ["stop"]
    assert not answer.choices[0].message.tool_calls
    assert answer.choices[0].message.content == "The tool add returned: 3\nThe tool add returned: 7"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_tool_round_trip_through_litellm(offline_gateway, stream):
    messages = user('[[tool:lookup {"q": "tides"}]]')
    asked, finishes = await complete(offline_gateway, messages, stream=stream, tools=[LOOKUP])
    assert finishes == ["tool_calls"]
    calls = calls_of(asked)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("lookup", {"q": "tides"})]
    messages += [
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "high"},
    ]
    answer, _ = await complete(offline_gateway, messages, stream=stream, tools=[LOOKUP])
    assert answer.choices[0].message.content == "The tool lookup returned: high"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_mixed_response_through_litellm_keeps_the_server_result(offline_gateway, stream):
    messages = user('[[tool:add {"a": 6, "b": 7}]] [[tool:lookup {"q": "x"}]]')
    asked, _ = await complete(offline_gateway, messages, stream=stream, tools=[LOOKUP])
    calls = calls_of(asked)
    assert [c["function"]["name"] for c in calls] == ["lookup"]
    messages += [
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "found"},
    ]
    answer, _ = await complete(offline_gateway, messages, tools=[LOOKUP])
    assert answer.choices[0].message.content == "The tool add returned: 13\nThe tool lookup returned: found"


@TOOL_CHOICE_CASES
async def test_litellms_tool_choice_and_parallel_tool_calls_are_honoured(offline_gateway, options, expected):
    answer, _ = await complete(offline_gateway, user(tool_choice_prompt(options)), tools=[LOOKUP, function_tool("other")], **options)
    assert [c["function"]["name"] for c in calls_of(answer)] == expected


@pytest.mark.parametrize("stream", [False, True])
async def test_litellms_parameters_and_system_message_reach_the_model(upstream_gateway, recording, stream):
    parameters = {
        "temperature": 0.4, "top_p": 0.6, "max_completion_tokens": 40, "stop": ["END"], "seed": 11,
        "presence_penalty": 0.2, "frequency_penalty": 0.3, "logit_bias": {"50256": -100},
        "response_format": {"type": "json_object"},
    }
    messages = [{"role": "system", "content": "Client system."}, {"role": "user", "content": "hi"}]
    # litellm sends `user` only for OpenAI's own model names: another model's goes in extra_body
    answer, _ = await complete(upstream_gateway, messages, UPSTREAM_MODEL, stream, extra_body={"user": "user-7"}, **parameters)
    assert answer.choices[0].message.content == up.DEFAULT_TEXT
    (sent,) = recording.received
    for name, value in {**parameters, "user": "user-7"}.items():
        assert sent[name] == value, name
    assert sent["messages"][0] == {"role": "system", "content": f"{AGENT_RULES}\n\nClient system."}


@pytest.mark.parametrize("stream", [False, True])
async def test_litellm_sees_an_upstream_429_as_a_rate_limit_with_its_retry_after(upstream_gateway, recording, stream):
    recording.answer(up.error(429, "Slow down", "rate_limit_exceeded", headers={"Retry-After": "5"}))
    with pytest.raises(litellm.RateLimitError) as caught:
        await complete(upstream_gateway, user("hi"), UPSTREAM_MODEL, stream)
    assert caught.value.status_code == 429
    assert caught.value.response.headers["retry-after"] == "5"
    assert "Slow down" in caught.value.message
    assert len(recording.received) == 1
