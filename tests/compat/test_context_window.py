"""The context window of a model hookbus does not know: configured, or asked of the endpoint;
an unknown model is not assumed to have 128k; the summary call's own input fits the window."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hookbus import Agent
from hookbus.services.orchestrator.compaction.rules import SUMMARY_INSTRUCTION
from hookbus.services.orchestrator.compaction.tokens import count_messages
from hookbus.services.orchestrator.llm.client import LLM
from tests.compat.upstream import RecordingUpstream

LLAMA_PROPS = {"default_generation_settings": {"n_ctx": 2048}, "total_slots": 1}


def agent_on(server: RecordingUpstream, model: str = "gemma-3-270m") -> Agent:
    return Agent("small", model=model, llm=LLM(base_url=server.url, api_key="k", timeout=5))


async def test_llama_cpps_props_give_the_window_of_an_unknown_model():
    with RecordingUpstream(props=LLAMA_PROPS) as server:
        assert await LLM(base_url=server.url, api_key="k").learn_model("gemma-3-270m", window=True) == 2048


async def test_vllms_model_list_gives_max_model_len():
    models = [{"id": "other", "max_model_len": 1}, {"id": "qwen-local", "max_model_len": 4096}]
    with RecordingUpstream(models=models) as server:
        assert await LLM(base_url=server.url, api_key="k").learn_model("qwen-local", window=True) == 4096


async def test_an_unknown_model_at_a_silent_endpoint_is_not_assumed_to_have_128k():
    with RecordingUpstream() as server:
        agent = agent_on(server, "my-finetune")
        await agent.run("hi")
        assert agent.context_window == 8192


async def test_hookbus_context_window_wins_and_the_endpoint_is_not_asked(monkeypatch):
    monkeypatch.setenv("HOOKBUS_CONTEXT_WINDOW", "3000")
    with RecordingUpstream(props=LLAMA_PROPS) as server:
        agent = agent_on(server)
        await agent.run("hi")
        assert agent.context_window == 3000
        assert "/props" not in server.paths


async def test_a_conversation_past_the_endpoints_window_is_compacted_to_fit_and_so_is_the_summary_call():
    filler = " ".join(f"fact{i} is {i * 7}." for i in range(400))  # about 2.8k tokens
    messages = [
        {"role": "user", "content": f"Remember: {filler}"},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "What did I ask?"},
    ]
    assert count_messages(messages) > 2048
    with RecordingUpstream(props=LLAMA_PROPS) as server:
        agent = agent_on(server)
        completion = await agent.run(messages)
    assert completion.choices[0].message.content == "upstream says hi"
    assert agent.context_window == 2048 and agent.last_compaction is not None
    summary_calls = [r for r in server.received if str(r["messages"][0]["content"]).startswith(SUMMARY_INSTRUCTION)]
    turns = [r for r in server.received if r not in summary_calls]
    assert summary_calls and all(count_messages(r["messages"]) < 2048 for r in summary_calls)
    assert count_messages(turns[-1]["messages"]) < 2048


@pytest.mark.parametrize("command", [["chat", "--local"]])
def test_the_context_window_flag_sets_the_window(command):
    done = subprocess.run(
        [sys.executable, "-m", "hookbus.services.cli.main", *command, "--context-window", "3000"],
        input="/quit\n", capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "window 3000 tokens" in done.stdout
