"""pydantic-ai: an `Agent` on `OpenAIChatModel` with an `OpenAIProvider` at the gateway.

pydantic-ai runs its own function tools (the gateway's client tools) and must never see
the agent's server-side tools: were `add` returned to it, it would answer the model
"Unknown tool" and loop.
"""

from __future__ import annotations

import openai
import pytest
from pydantic import BaseModel
from pydantic_ai import Agent as PaiAgent
from pydantic_ai import NativeOutput
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings, ToolOrOutput

from tests.compat import upstream as up
from tests.compat.conftest import AGENT_RULES, TWO_LOOKUPS, UPSTREAM_MODEL

LOOKED_UP: list[str] = []


def lookup(q: str) -> str:
    """Look something up.

    Args:
        q: What to look up.
    """
    LOOKED_UP.append(q)
    return f"found {q}"


def other(q: str) -> str:
    """Another lookup.

    Args:
        q: What to look up.
    """
    return f"other {q}"


def pai_agent(gateway, model: str = "offline", tools=(), settings: ModelSettings | None = None, output_type=str) -> PaiAgent:
    client = openai.AsyncOpenAI(base_url=gateway.v1, api_key="sk-any", max_retries=0)
    return PaiAgent(
        OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client)),
        instructions="PAI instructions.", tools=list(tools), model_settings=settings, output_type=output_type,
    )


async def run(agent: PaiAgent, prompt: str, streamed: bool):
    """The run's output and every message of it, streamed (`run_stream`) or not."""
    if not streamed:
        result = await agent.run(prompt)
        return result.output, result.all_messages()
    async with agent.run_stream(prompt) as result:
        output = await result.get_output()
    return output, result.all_messages()


def tool_calls(messages) -> list[str]:
    return [p.tool_name for m in messages if isinstance(m, ModelResponse) for p in m.parts if isinstance(p, ToolCallPart)]


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_server_tool_round_is_one_answer_for_pydantic_ai(offline_gateway, streamed):
    output, messages = await run(pai_agent(offline_gateway), '[[tool:add {"a": 2, "b": 3}]]', streamed)
    assert output == "The tool add returned: 5"
    assert tool_calls(messages) == []
    assert len([m for m in messages if isinstance(m, ModelResponse)]) == 1


@pytest.mark.parametrize("streamed", [False, True])
async def test_pydantic_ai_runs_its_function_tool_and_the_turn_goes_on(offline_gateway, streamed):
    LOOKED_UP.clear()
    output, messages = await run(pai_agent(offline_gateway, tools=[lookup]), '[[tool:lookup {"q": "tides"}]]', streamed)
    assert LOOKED_UP == ["tides"]
    assert tool_calls(messages) == ["lookup"]
    assert output == "The tool lookup returned: found tides"


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_mixed_response_for_pydantic_ai_keeps_the_server_result(offline_gateway, streamed):
    LOOKED_UP.clear()
    agent = pai_agent(offline_gateway, tools=[lookup])
    output, messages = await run(agent, '[[tool:add {"a": 1, "b": 1}]] [[tool:lookup {"q": "moon"}]]', streamed)
    assert LOOKED_UP == ["moon"]
    assert tool_calls(messages) == ["lookup"]
    assert output == "The tool add returned: 2\nThe tool lookup returned: found moon"


@pytest.mark.parametrize(
    ("settings", "looked_up"),
    [(ModelSettings(), ["a", "b"]), (ModelSettings(parallel_tool_calls=False), ["a"]), (ModelSettings(tool_choice="none"), [])],
)
async def test_pydantic_ais_tool_choice_and_parallel_tool_calls_are_honoured(offline_gateway, settings, looked_up):
    LOOKED_UP.clear()
    await run(pai_agent(offline_gateway, tools=[lookup], settings=settings), TWO_LOOKUPS, False)
    assert sorted(LOOKED_UP) == looked_up  # pydantic-ai runs parallel calls concurrently


async def test_tool_or_output_offers_the_model_only_the_listed_function_tools(offline_gateway):
    # pydantic-ai sends OpenAI's allowed_tools tool_choice, which the gateway narrows
    LOOKED_UP.clear()
    settings = ModelSettings(tool_choice=ToolOrOutput(function_tools=["other"]))
    agent = pai_agent(offline_gateway, tools=[lookup, other], settings=settings)
    output, messages = await run(agent, '[[tool:lookup {"q": "a"}]] [[tool:other {"q": "b"}]]', True)
    assert tool_calls(messages) == ["other"] and LOOKED_UP == []
    assert output == "The tool other returned: other b"


async def test_tool_or_output_reaches_the_model_as_the_listed_tools_and_its_mode(upstream_gateway, recording):
    settings = ModelSettings(tool_choice=ToolOrOutput(function_tools=["other"]))
    await run(pai_agent(upstream_gateway, UPSTREAM_MODEL, [lookup, other], settings), "hi", False)
    (sent,) = recording.received
    assert sent["tool_choice"] == "auto"
    assert sorted(t["function"]["name"] for t in sent["tools"]) == ["add", "other"]  # the agent's add stays


async def test_pydantic_ais_settings_and_instructions_reach_the_model(upstream_gateway, recording):
    settings = ModelSettings(
        temperature=0.3, top_p=0.7, max_tokens=50, seed=5, presence_penalty=0.2, frequency_penalty=0.4,
        logit_bias={"50256": -100}, stop_sequences=["END"], parallel_tool_calls=False, tool_choice="none",
    )
    output, _ = await run(pai_agent(upstream_gateway, UPSTREAM_MODEL, [lookup], settings), "hi", False)
    assert output == up.DEFAULT_TEXT
    (sent,) = recording.received
    assert (sent["temperature"], sent["top_p"], sent["seed"], sent["stop"]) == (0.3, 0.7, 5, ["END"])
    assert (sent["presence_penalty"], sent["frequency_penalty"], sent["logit_bias"]) == (0.2, 0.4, {"50256": -100})
    assert sent["max_tokens"] == 100  # pinned by the agent (pydantic-ai asked for 50)
    assert (sent["tool_choice"], sent["parallel_tool_calls"]) == ("none", False)
    assert sent["messages"][0] == {"role": "system", "content": f"{AGENT_RULES}\n\nPAI instructions."}


class City(BaseModel):
    name: str


async def test_native_output_reaches_the_model_as_a_json_schema_response_format(upstream_gateway, recording):
    recording.answer(up.Reply(up.completion('{"name": "Paris"}')))
    output, _ = await run(pai_agent(upstream_gateway, UPSTREAM_MODEL, output_type=NativeOutput(City)), "hi", False)
    assert output == City(name="Paris")
    (sent,) = recording.received
    assert sent["response_format"]["type"] == "json_schema"
    assert sent["response_format"]["json_schema"]["schema"]["properties"] == {"name": {"type": "string"}}


async def test_pydantic_ai_sees_an_upstream_429_as_a_rate_limit_with_its_retry_after(upstream_gateway, recording):
    recording.answer(up.error(429, "Slow down", "rate_limit_exceeded", headers={"Retry-After": "8"}))
    with pytest.raises(ModelHTTPError) as caught:
        await run(pai_agent(upstream_gateway, UPSTREAM_MODEL), "hi", False)
    assert caught.value.status_code == 429
    assert caught.value.headers is not None and caught.value.headers["retry-after"] == "8"
    assert len(recording.received) == 1

