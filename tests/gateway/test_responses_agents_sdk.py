"""The OpenAI Agents SDK in its default mode (`OpenAIResponsesModel`, the Responses API)
against the gateway: it runs its own function tool, the gateway returns the call to it
and the agent's turn goes on with the result it sends back."""

from __future__ import annotations

import openai
import pytest
from agents import Agent as SdkAgent
from agents import OpenAIResponsesModel, Runner

from tests.agents_sdk_tool import LOOKED_UP, lookup
from tests.gateway.conftest import KEY


def sdk_agent(gateway) -> SdkAgent:
    client = openai.AsyncOpenAI(base_url=gateway.v1, api_key=KEY, max_retries=0, timeout=30)
    return SdkAgent(
        name="sdk", instructions="SDK instructions.", tools=[lookup],
        model=OpenAIResponsesModel(model="offline", openai_client=client),
    )


@pytest.mark.parametrize("streamed", [False, True])
async def test_the_sdk_runs_its_function_tool_over_the_responses_api(gateway, streamed):
    LOOKED_UP.clear()
    agent = sdk_agent(gateway)
    prompt = '[[tool:lookup {"q": "tides"}]]'
    if streamed:
        result = Runner.run_streamed(agent, prompt)
        deltas = [
            event.data.delta async for event in result.stream_events()
            if event.type == "raw_response_event" and event.data.type == "response.output_text.delta"
        ]
        assert "".join(deltas) == "The tool lookup returned: found tides"
    else:
        result = await Runner.run(agent, prompt)
    assert LOOKED_UP == ["tides"]
    assert result.final_output == "The tool lookup returned: found tides"
    assert [item.type for item in result.new_items] == [
        "tool_call_item", "tool_call_output_item", "message_output_item",
    ]
    assert all(response.response_id.startswith("resp_") for response in result.raw_responses)


async def test_the_sdk_without_tools_gets_a_plain_answer(gateway):
    result = await Runner.run(sdk_agent(gateway), "[[echo]] plain")
    assert result.final_output == "plain"
