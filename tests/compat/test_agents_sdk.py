"""The OpenAI Agents SDK (`openai-agents`), its Chat Completions model pointed at the gateway.

The SDK runs its own function tools (the gateway's client tools) and must never see the
agent's server-side tools: before, it raised `Tool add not found` or ran them itself.
"""

from __future__ import annotations

import openai
import pytest
from agents import Agent as SdkAgent
from agents import (
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
)

from tests.agents_sdk_tool import LOOKED_UP, lookup
from tests.compat import upstream as up
from tests.compat.conftest import UPSTREAM_MODEL


def sdk_agent(gateway, model: str = "offline", tools=(), settings: ModelSettings | None = None) -> SdkAgent:
    client = openai.AsyncOpenAI(base_url=gateway.v1, api_key="sk-any", max_retries=0)
    return SdkAgent(
        name="sdk", instructions="SDK instructions.", tools=list(tools),
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        model_settings=settings or ModelSettings(),
    )


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_server_tool_round_is_one_turn_for_the_sdk(offline_gateway, streamed):
    agent = sdk_agent(offline_gateway)
    prompt = '[[tool:add {"a": 2, "b": 3}]]'
    if streamed:
        result = Runner.run_streamed(agent, prompt)
        async for _ in result.stream_events():
            pass
    else:
        result = await Runner.run(agent, prompt)
    assert result.final_output == "The tool add returned: 5"
    assert not [item for item in result.new_items if item.type == "tool_call_item"]


@pytest.mark.parametrize("streamed", [False, True])
async def test_the_sdk_runs_its_own_tool_and_the_turn_goes_on(offline_gateway, streamed):
    LOOKED_UP.clear()
    agent = sdk_agent(offline_gateway, tools=[lookup])
    prompt = '[[tool:lookup {"q": "tides"}]]'
    if streamed:
        result = Runner.run_streamed(agent, prompt)
        async for _ in result.stream_events():
            pass
    else:
        result = await Runner.run(agent, prompt)
    assert LOOKED_UP == ["tides"]
    assert result.final_output == "The tool lookup returned: found tides"


async def test_a_mixed_response_for_the_sdk_keeps_the_server_result(offline_gateway):
    LOOKED_UP.clear()
    agent = sdk_agent(offline_gateway, tools=[lookup])
    result = await Runner.run(agent, '[[tool:add {"a": 1, "b": 1}]] [[tool:lookup {"q": "moon"}]]')
    assert LOOKED_UP == ["moon"]
    assert result.final_output == "The tool add returned: 2\nThe tool lookup returned: found moon"


async def test_the_sdks_tool_choice_and_model_settings_reach_the_model(upstream_gateway, recording):
    recording.answer(
        up.Reply(up.completion(None, [{"id": "call_1", "type": "function",
                                       "function": {"name": "lookup", "arguments": '{"q": "a"}'}}])),
        up.Reply(up.completion("done")),
    )
    settings = ModelSettings(temperature=0.3, top_p=0.7, tool_choice="lookup", max_tokens=50, extra_args={"seed": 5})
    result = await Runner.run(sdk_agent(upstream_gateway, UPSTREAM_MODEL, [lookup], settings), "hi")
    assert result.final_output == "done"
    first = recording.received[0]
    assert first["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    assert (first["temperature"], first["top_p"], first["seed"]) == (0.3, 0.7, 5)
    assert first["max_tokens"] == 100  # pinned by the agent (the SDK asked for 50)
    assert first["messages"][0]["content"].endswith("SDK instructions.")


async def test_the_sdk_sees_an_upstream_429_as_a_rate_limit_with_its_retry_after(upstream_gateway, recording):
    recording.answer(up.error(429, "Slow down", "rate_limit_exceeded", headers={"Retry-After": "6"}))
    with pytest.raises(openai.RateLimitError) as caught:
        await Runner.run(sdk_agent(upstream_gateway, UPSTREAM_MODEL), "hi")
    assert caught.value.response.headers["retry-after"] == "6"
    assert caught.value.code == "rate_limit_exceeded"
    assert len(recording.received) == 1  # the SDK's client has max_retries=0: one upstream call
