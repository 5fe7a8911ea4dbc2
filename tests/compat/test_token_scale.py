"""Compaction budgets in the model's own tokens: a local model's tokenizer that counts more
than tiktoken (asked through its tokenize endpoint, or seen in the usage it reports) shrinks
what hookbus lets through, so the conversation and the summary call fit the real window."""

from __future__ import annotations

import json

from hookbus import Agent, Skill, tool
from hookbus.services.orchestrator.compaction.rules import SUMMARY_INSTRUCTION
from hookbus.services.orchestrator.compaction.token_scale import (
    MIN_COUNTED,
    SAMPLE_TEXT,
    UNKNOWN_MODEL_MARGIN,
    TokenScale,
)
from hookbus.services.orchestrator.compaction.tokens import count_messages, count_text
from hookbus.services.orchestrator.llm.client import LLM
from tests.compat.upstream import RecordingUpstream, Reply, completion, text_stream

LLAMA_PROPS = {"default_generation_settings": {"n_ctx": 2048}, "total_slots": 1}


class Weather(Skill):
    name = "weather"

    @tool
    def forecast(self, city: str, days: int, unit: str, hourly: bool) -> str:
        """The weather forecast for a city over the coming days, in the unit asked, by day
        or by hour, with the chance of rain and the wind for each period.

        Args:
            city: The city, in English, with its country when the name is ambiguous.
            days: How many days ahead, from 1 to 14.
            unit: "celsius" or "fahrenheit".
            hourly: Whether to give each hour rather than each day.
        """
        return f"sunny in {city}"


def agent_on(server: RecordingUpstream) -> Agent:
    return Agent("small", model="gemma-3-270m", llm=LLM(base_url=server.url, api_key="k", timeout=5))


def conversation(facts: int) -> list[dict[str, str]]:
    filler = " ".join(f"fact{i} is {i * 7}." for i in range(facts))
    return [
        {"role": "user", "content": f"Remember: {filler}"},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "What is fact3?"},
    ]


def chat_calls(server: RecordingUpstream) -> tuple[list[dict], list[dict]]:
    summaries = [r for r in server.received if str(r["messages"][0]["content"]).startswith(SUMMARY_INSTRUCTION)]
    return summaries, [r for r in server.received if r not in summaries]


def test_the_scale_of_a_model_comes_from_reports_then_the_probe_then_the_default():
    scale = TokenScale()
    assert scale.of("gpt-4o-mini") == 1.0
    assert scale.of("gemma-3-270m") == UNKNOWN_MODEL_MARGIN
    scale.probed("gemma-3-270m", theirs=130, ours=100)
    assert scale.of("gemma-3-270m") == 1.3
    scale.report("gemma-3-270m", prompt_tokens=1500, counted=1000)
    scale.report("gemma-3-270m", prompt_tokens=1200, counted=1000)
    assert scale.of("gemma-3-270m") == 1.5  # the largest recent report: never under-count
    scale.report("gemma-3-270m", prompt_tokens=5, counted=1000)  # a broken usage figure
    scale.report("gemma-3-270m", prompt_tokens=900, counted=10)  # too small to say anything
    assert scale.of("gemma-3-270m") == 1.5
    assert TokenScale(exact=True).of("gemma-3-270m") == 1.0


async def test_a_tokenizer_that_counts_double_halves_the_budget_and_the_calls_fit_the_real_window():
    messages = conversation(220)  # about 1.5k tokens by tiktoken: under 0.8 x 2048
    ours = count_messages(messages)
    assert 1300 < ours < 0.8 * 2048
    # The model counts twice what tiktoken does, on the probe's sample as on the conversation.
    with RecordingUpstream(props=LLAMA_PROPS, tokens_per_char=2 * count_text(SAMPLE_TEXT) / len(SAMPLE_TEXT)) as server:
        agent = agent_on(server)
        await agent.run(messages)
    assert "/extras/tokenize" in server.paths
    assert agent.context_window == 2048  # the model's window, in its tokens
    assert agent.last_compaction is not None and agent.last_compaction.stage == "summarized"
    summaries, turns = chat_calls(server)
    assert summaries and all(2 * count_messages(r["messages"]) < 2048 for r in summaries)
    assert 2 * count_messages(turns[-1]["messages"]) < 2048


async def test_usage_reports_teach_the_scale_of_a_model_whose_endpoint_cannot_tokenize():
    messages = conversation(170)
    ours = count_messages(messages)
    with RecordingUpstream(props=LLAMA_PROPS) as server:
        agent = agent_on(server)
        first = completion("ok")
        first["usage"] = {"prompt_tokens": 2 * count_messages(conversation(60)), "completion_tokens": 1,
                          "total_tokens": 0}
        server.script.append(Reply(first))
        await agent.run(conversation(60))  # small: fits either way; its usage says "x2"
        assert agent.last_compaction is None
        await agent.run(messages)  # fits by tiktoken and the default margin, not at x2
    assert ours * UNKNOWN_MODEL_MARGIN < 0.8 * 2048 < ours * 2
    assert agent.last_compaction is not None and agent.last_compaction.stage == "summarized"
    _, turns = chat_calls(server)
    assert 2 * count_messages(turns[-1]["messages"]) < 2048


async def test_the_tools_offered_count_on_both_sides_of_a_usage_report():
    """A short conversation offering tools: the endpoint's prompt count holds the tools'
    schemas, so hookbus's count must too, else the scale reads the tools as a tokenizer
    that counts three times tiktoken's and the window shrinks to a third."""
    messages = conversation(8)
    tools = Agent("small", model="gemma-3-270m", skills=[Weather()]).plan().tool_schemas([])
    ours = count_messages(messages) + count_text(json.dumps(tools))
    assert count_text(json.dumps(tools)) > count_messages(messages) >= MIN_COUNTED
    with RecordingUpstream(props=LLAMA_PROPS) as server:
        llm = LLM(base_url=server.url, api_key="k", timeout=5)
        answer = completion("Sunny.")
        answer["usage"] = {"prompt_tokens": int(1.2 * ours), "completion_tokens": 1, "total_tokens": 0}
        server.script.append(Reply(answer))
        await llm.complete("gemma-3-270m", messages, tools)
    assert server.received[-1]["tools"] == tools
    assert abs(llm.token_scale.of("gemma-3-270m") - 1.2) < 0.02


async def test_an_endpoint_known_as_llama_cpp_python_still_gets_its_tool_rounds_streamed():
    """Answering llama-cpp-python's tokenize endpoint says nothing of how it answers a tool
    round: a chat handler that streams `tool_choice: "auto"` is asked for a stream every
    time. One that ends such a stream at once
    goes unstreamed after that first time
    (`test_upstream.py::test_tool_rounds_go_unstreamed_once_an_endpoint_ends_their_stream_at_once`)."""
    with RecordingUpstream(props=LLAMA_PROPS, tokens_per_char=0.3) as server:
        agent = Agent("tools", model="gemma-3-270m", skills=[Weather()],
                      llm=LLM(base_url=server.url, api_key="k", timeout=5))
        await agent.compact([{"role": "user", "content": "Hi"}])  # asked for: the endpoint is probed
        server.script.extend([text_stream("Sunny."), text_stream("Rainy.")])
        answers = []
        for question in ("Weather in Paris?", "Weather in Oslo?"):
            chunks = [c async for c in agent.run_stream(question)]
            answers.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
    assert "/extras/tokenize" in server.paths
    assert answers == ["Sunny.", "Rainy."]
    assert [(r.get("stream", False), r.get("tool_choice")) for r in server.received] == [(True, "auto")] * 2
