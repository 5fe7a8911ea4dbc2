"""What reaches the LLM endpoint, request by request: a paid or audited upstream must see
exactly the model calls a run makes. A request refused before its first LLM call sends
nothing; a conversation far under the window sends one chat request per model call; the
endpoint's window and tokenizer are asked only when a conversation nears the window, and
then once per model in a process.

The endpoint is a recording double (tests/compat/upstream.py) serving a model tiktoken does
not know, the case in which hookbus would ask it for its tokenizer."""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest

from hookbus import Agent, Context, HookData, HookError, PaymentRequired, Skill, hook, tool
from hookbus.services.orchestrator.llm.client import LLM
from tests.compat.upstream import RecordingUpstream, Reply, Seen, completion
from tests.gateway.server import running_gateway
from tests.integration.stack import running_stack

LOCAL_MODEL = "local-instruct-7b"
LLAMA_PROPS = {"default_generation_settings": {"n_ctx": 2048}, "total_slots": 1}
CHAT = ("POST", "/v1/chat/completions")


class Credit(Skill):
    name = "credit"

    @hook("on_connection", priority=1)
    async def check(self, data: HookData, ctx: Context) -> None:
        if "broke" in str((data.messages or [{}])[-1].get("content")):
            raise PaymentRequired("no credit left")


class Counter(Skill):
    name = "counter"

    @tool
    def tick(self, n: int) -> int:
        """Count one more.

        Args:
            n: The count so far.
        """
        return n + 1


def agent_on(server: RecordingUpstream, **options: object) -> Agent:
    return Agent("local", model=LOCAL_MODEL, llm=LLM(base_url=server.url, api_key="k", timeout=5), **options)


def kinds(server: RecordingUpstream) -> list[tuple[str, str]]:
    return [(seen.method, seen.path) for seen in server.seen]


def long_conversation() -> list[dict[str, str]]:
    """About 1,500 tokens by tiktoken: under every threshold by our count, within reach of a
    2048-token window by a tokenizer that counts 1.35x ours."""
    filler = " ".join(f"fact{i} is {i * 7}." for i in range(220))
    return [{"role": "user", "content": f"Remember: {filler}"}, {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": "What is fact3?"}]


async def test_a_request_refused_at_on_connection_sends_nothing_to_the_endpoint():
    with RecordingUpstream(props=LLAMA_PROPS, tokens_per_char=0.3) as server:
        agent = agent_on(server, skills=[Credit()])
        with pytest.raises(HookError) as refused:
            await agent.run(long_conversation()[:-1] + [{"role": "user", "content": "I am broke"}])
        assert refused.value.status_code == 402
        with pytest.raises(HookError):
            [c async for c in agent.run_stream("broke again")]
    assert server.seen == []


async def test_a_short_conversation_sends_one_chat_request_per_model_call_and_nothing_else():
    with RecordingUpstream(props=LLAMA_PROPS, tokens_per_char=0.3) as server:
        agent = agent_on(server, skills=[Counter()], max_tool_rounds=2)
        call = {"id": "c1", "type": "function", "function": {"name": "tick", "arguments": '{"n": 1}'}}
        server.answer(*(Reply(completion(None, tool_calls=[call])) for _ in range(2)), Reply(completion("done")))
        answer = await agent.run("count for me")
    assert answer.choices[0].message.content == "done"
    assert kinds(server) == [CHAT] * 3  # the cap's N rounds and the final call without tools
    assert "tools" not in server.received[-1]


async def test_the_endpoint_is_asked_once_per_model_when_a_conversation_nears_the_window():
    with RecordingUpstream(props=LLAMA_PROPS, tokens_per_char=0.3) as server:
        for _ in range(2):  # two agents of one process, on the same endpoint and model
            await agent_on(server).run(long_conversation())
    probes = [seen for seen in server.seen if seen.path != CHAT[1]]
    assert probes == [Seen("GET", "/props", None), Seen("POST", "/extras/tokenize", probes[1].body)]
    assert probes[1].body is not None and probes[1].body["model"] == LOCAL_MODEL
    assert kinds(server).index(("GET", "/props")) == 0  # before the first call, which needs it


async def test_through_the_gateway_a_refused_request_reaches_no_endpoint(redis_url: str):
    prefix = f"ep{uuid.uuid4().hex[:8]}:"
    with RecordingUpstream(props=LLAMA_PROPS, tokens_per_char=0.3) as server:
        agent = agent_on(server, skills=[Credit()])
        async with running_stack(redis_url, prefix, agent), running_gateway(
            redis_url, prefix, models=[LOCAL_MODEL]
        ) as gateway:
            client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0)
            for stream in (False, True):
                with pytest.raises(openai.APIStatusError) as refused:
                    await client.chat.completions.create(
                        model=LOCAL_MODEL, stream=stream, messages=[{"role": "user", "content": "broke"}]
                    )
                assert refused.value.status_code == 402
            answer = await client.chat.completions.create(
                model=LOCAL_MODEL, messages=[{"role": "user", "content": "hello"}]
            )
            assert answer.choices[0].message.content
            async with httpx.AsyncClient() as http:  # the gateway's own health check asks no model
                assert (await http.get(f"{gateway.url}/healthz")).status_code == 200
    assert kinds(server) == [CHAT]
