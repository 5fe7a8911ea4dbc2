"""What reaches the model, and what comes back when it fails: the openai SDK against the
gateway, the gateway's agent against a recording upstream (a real HTTP server)."""

from __future__ import annotations

import json

import openai
import pytest

from hookbus import Agent
from hookbus.services.orchestrator.llm.client import LLM
from tests.compat import upstream as up
from tests.compat.conftest import AGENT_RULES, UPSTREAM_MODEL, Calc, function_tool

HI = [{"role": "user", "content": "hi"}]
EVERY_PARAMETER = {
    "temperature": 0.7,
    "top_p": 0.9,
    "max_completion_tokens": 64,
    "stop": ["END"],
    "seed": 7,
    "presence_penalty": 0.5,
    "frequency_penalty": -0.5,
    "logit_bias": {"50256": -100},
    "logprobs": True,
    "top_logprobs": 2,
    "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}},
    "user": "user-1",
}


def client_for(gateway, max_retries: int = 0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.v1, api_key="sk-any", max_retries=max_retries, timeout=30)


@pytest.mark.parametrize("stream", [False, True])
async def test_every_parameter_reaches_the_model(upstream_gateway, recording, stream):
    async with client_for(upstream_gateway) as client:
        if stream:
            response = await client.chat.completions.create(model=UPSTREAM_MODEL, messages=HI, stream=True, **EVERY_PARAMETER)
            text = "".join([c.choices[0].delta.content or "" async for c in response if c.choices])
        else:
            completion = await client.chat.completions.create(model=UPSTREAM_MODEL, messages=HI, **EVERY_PARAMETER)
            text = completion.choices[0].message.content
    assert text == up.DEFAULT_TEXT
    (sent,) = recording.received
    for name, value in EVERY_PARAMETER.items():
        assert sent[name] == value, name
    assert sent["model"] == UPSTREAM_MODEL
    assert sent["tool_choice"] == "auto"  # the agent's own tool is offered: "auto", said explicitly


async def test_agent_defaults_fill_in_and_pins_win(upstream_gateway, recording):
    async with client_for(upstream_gateway) as client:
        await client.chat.completions.create(model=UPSTREAM_MODEL, messages=HI, top_p=0.8, max_tokens=999)
    (sent,) = recording.received
    assert sent["top_p"] == 0.8  # the client's value replaces the agent's default
    assert sent["presence_penalty"] == 0.1  # the agent's default where the client gave none
    assert sent["max_tokens"] == 100  # pinned by the agent


async def test_a_before_llm_call_hook_in_a_worker_reads_and_changes_the_settings(upstream_gateway, recording):
    async with client_for(upstream_gateway) as client:
        await client.chat.completions.create(model=UPSTREAM_MODEL, messages=HI, temperature=1.5)
    assert recording.received[0]["temperature"] == 0.25


async def test_tools_go_up_with_tool_choice_auto_and_every_round_gets_the_settings(upstream_gateway, recording):
    recording.answer(
        up.Reply(up.completion(None, [{"id": "call_1", "type": "function",
                                       "function": {"name": "add", "arguments": '{"a": 2, "b": 5}'}}])),
        up.Reply(up.completion("seven")),
    )
    async with client_for(upstream_gateway) as client:
        completion = await client.chat.completions.create(
            model=UPSTREAM_MODEL, messages=HI, tools=[function_tool("lookup")], seed=3, parallel_tool_calls=False
        )
    assert completion.choices[0].message.content == "seven"
    first, second = recording.received
    assert first["tool_choice"] == "auto" and first["parallel_tool_calls"] is False
    assert {t["function"]["name"] for t in first["tools"]} == {"add", "lookup"}
    assert first["seed"] == second["seed"] == 3
    # the assistant message with only tool calls goes up in the form llama.cpp accepts
    assistant = second["messages"][-2]
    assert assistant["role"] == "assistant" and assistant["content"] == "" and "function_call" not in assistant
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "7"}


async def test_a_forcing_tool_choice_applies_to_the_first_call_only(upstream_gateway, recording):
    recording.answer(
        up.Reply(up.completion(None, [{"id": "call_1", "type": "function",
                                       "function": {"name": "add", "arguments": '{"a": 1, "b": 1}'}}])),
    )
    async with client_for(upstream_gateway) as client:
        await client.chat.completions.create(model=UPSTREAM_MODEL, messages=HI, tools=[function_tool("x")], tool_choice="required")
    assert [r["tool_choice"] for r in recording.received] == ["required", "auto"]


async def test_the_agents_instructions_come_first_and_the_clients_system_text_after(upstream_gateway, recording):
    async with client_for(upstream_gateway) as client:
        await client.chat.completions.create(
            model=UPSTREAM_MODEL, messages=[{"role": "system", "content": "Client: answer in French."}, *HI]
        )
    messages = recording.received[0]["messages"]
    assert messages[0] == {"role": "system", "content": f"{AGENT_RULES}\n\nClient: answer in French."}
    assert messages[1:] == HI


async def test_an_upstream_429_stays_a_429_with_its_retry_after_message_and_code(upstream_gateway, recording):
    recording.answer(up.error(429, "Slow down: tokens per minute", "rate_limit_exceeded", headers={"Retry-After": "7"}))
    async with client_for(upstream_gateway) as client:
        with pytest.raises(openai.RateLimitError) as caught:
            await client.chat.completions.create(model=UPSTREAM_MODEL, messages=HI)
    assert caught.value.status_code == 429
    assert caught.value.response.headers["retry-after"] == "7"
    assert caught.value.body["message"] == "Slow down: tokens per minute"
    assert caught.value.code == "rate_limit_exceeded"


async def test_a_streamed_request_gets_the_429_as_a_real_http_error(upstream_gateway, recording):
    recording.answer(up.error(429, "Slow down", "rate_limit_exceeded", headers={"Retry-After": "3"}))
    async with client_for(upstream_gateway) as client:
        with pytest.raises(openai.RateLimitError) as caught:
            await client.chat.completions.create(model=UPSTREAM_MODEL, messages=HI, stream=True)
    assert caught.value.response.headers["retry-after"] == "3"


async def test_an_upstream_400_is_the_clients_400_with_message_code_and_param(upstream_gateway, recording):
    recording.answer(up.error(400, "Unsupported value: 'logprobs'", "unsupported_value", param="logprobs"))
    async with client_for(upstream_gateway) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model=UPSTREAM_MODEL, messages=HI, logprobs=True)
    assert caught.value.body["message"] == "Unsupported value: 'logprobs'"
    assert caught.value.code == "unsupported_value" and caught.value.param == "logprobs"


@pytest.mark.parametrize(("upstream_status", "client_status"), [(500, 502), (502, 502), (503, 503), (504, 504), (401, 502)])
async def test_upstream_failures_map_to_502_503_504(upstream_gateway, recording, upstream_status, client_status):
    recording.answer(up.error(upstream_status, f"upstream broke with {upstream_status}", "server_error"))
    async with client_for(upstream_gateway) as client:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model=UPSTREAM_MODEL, messages=HI)
    assert caught.value.status_code == client_status
    assert caught.value.body["message"] == f"upstream broke with {upstream_status}"
    assert caught.value.body["details"]["upstream_status"] == upstream_status


async def test_the_clients_retries_are_not_multiplied_by_the_adapter(upstream_gateway, recording):
    recording.answer(*[up.error(503, "overloaded", "overloaded")] * 3)
    async with client_for(upstream_gateway, max_retries=2) as client:
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model=UPSTREAM_MODEL, messages=HI)
    assert len(recording.received) == 3  # one upstream call per client attempt


async def test_a_slow_generation_times_out_once_and_is_not_sent_again(upstream_gateway, recording):
    recording.answer(up.Reply(up.completion(), delay=3.0))  # the agent's LLM timeout is 2 s
    async with client_for(upstream_gateway) as client:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model=UPSTREAM_MODEL, messages=HI)
    assert caught.value.status_code == 504 and caught.value.code == "llm_timeout"
    assert len(recording.received) == 1


async def test_an_empty_stream_is_asked_again_unstreamed_and_its_real_error_reaches_the_client(upstream_gateway, recording):
    recording.answer(up.Stream([], done=False))
    recording.answer(up.error(500, "the model ran out of memory", None))
    async with client_for(upstream_gateway) as client:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model=UPSTREAM_MODEL, messages=HI, stream=True)
    assert caught.value.status_code == 502 and "the model ran out of memory" in str(caught.value)
    assert [r.get("stream", False) for r in recording.received] == [True, False]


async def test_tool_rounds_go_unstreamed_once_an_endpoint_ends_their_stream_at_once():
    """llama-cpp-python ends a stream that carries tool_choice "auto" without a chunk and
    answers the same call unstreamed: the answer streams on, the next tool rounds skip it."""
    with up.RecordingUpstream() as server:
        agent = Agent("tools", model=UPSTREAM_MODEL, skills=[Calc()], llm=LLM(base_url=server.url, api_key="k"))
        server.answer(up.Stream([], done=False))
        server.answer(up.Reply(up.completion("five")))
        first = "".join([c.choices[0].delta.content or "" async for c in agent.run_stream("2+3?") if c.choices])
        server.answer(up.Reply(up.completion("six")))
        second = "".join([c.choices[0].delta.content or "" async for c in agent.run_stream("3+3?") if c.choices])
        no_tools = [c async for c in agent.llm.stream(UPSTREAM_MODEL, HI, None)]
    assert (first, second) == ("five", "six")
    assert [(r.get("stream", False), r.get("tool_choice")) for r in server.received] == [
        (True, "auto"), (False, "auto"), (False, "auto"), (True, None),
    ]
    assert no_tools[-1].usage is not None


@pytest.mark.parametrize("stream", [False, True])
async def test_an_answer_with_no_text_and_no_tool_call_is_a_502_with_its_cause(upstream_gateway, recording, stream):
    """Under the client's own `tool_choice: "none"`, nothing else to ask: one call, the 502
    (under "auto" it is asked again first: tests/compat/test_empty_answer.py)."""
    recording.answer(up.silent(stream))
    async with client_for(upstream_gateway) as client:
        with pytest.raises(openai.APIError) as caught:
            response = await client.chat.completions.create(
                model=UPSTREAM_MODEL, messages=HI, stream=stream, tool_choice="none"
            )
            if stream:
                [c async for c in response]  # the error arrives in the stream
    error = caught.value
    assert getattr(error, "code", None) == "empty_answer" or (error.body or {}).get("code") == "empty_answer", error
    assert "no text and no tool call (finish_reason stop)" in str(error)
    assert [sent.get("tool_choice") for sent in recording.received] == ["none"]


async def test_a_function_name_repeated_in_every_delta_is_assembled_once(upstream_gateway, recording):
    repeated = [
        up.chunk({"role": "assistant", "content": None}),
        up.chunk({"tool_calls": [{"index": 0, "id": "call_9", "type": "function", "function": {"name": "lookup", "arguments": ""}}]}),
        up.chunk({"tool_calls": [{"index": 0, "function": {"name": "lookup", "arguments": '{"q": '}}]}),
        up.chunk({"tool_calls": [{"index": 0, "function": {"name": "lookup", "arguments": '"x"}'}}]}),
        up.chunk({}, "tool_calls"),
    ]
    recording.answer(up.Stream(repeated))
    async with client_for(upstream_gateway) as client:
        response = await client.chat.completions.create(
            model=UPSTREAM_MODEL, messages=HI, tools=[function_tool("lookup")], stream=True
        )
        calls = [d for c in [c async for c in response] if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("lookup", {"q": "x"})]


async def test_a_stream_without_usage_gets_a_tiktoken_estimate_marked_as_such(upstream_gateway, recording):
    recording.answer(up.text_stream("one two three", usage=False))
    async with client_for(upstream_gateway) as client:
        response = await client.chat.completions.create(
            model=UPSTREAM_MODEL, messages=HI, stream=True, stream_options={"include_usage": True}
        )
        chunks = [c async for c in response]
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 3 and usage.prompt_tokens > 0
    assert usage.model_extra == {"estimated": True}
