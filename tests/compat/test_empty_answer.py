"""An empty answer under `tool_choice: "auto"` is asked once more with "none", through the
gateway with the openai client, streamed and not: the client gets the second answer's
text (and nothing of the first), the retry is counted in /metrics and shown in the
request's waterfall; only an empty answer to that too is a 502 `empty_answer`.

The endpoint double answers as llama-cpp-python's `chatml-function-calling` format does
when the model answers in text (tests/compat/upstream.py, `says_nothing_under_auto`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest

from hookbus import Agent, Context, HookData, Skill, hook
from hookbus.services.orchestrator.llm.client import LLM
from tests.compat import upstream as up
from tests.compat.conftest import UPSTREAM_MODEL, Calc
from tests.gateway.server import RunningGateway, running_gateway
from tests.gateway.test_ops import sample
from tests.integration.stack import running_stack
from tests.waiting import wait_for

HI = [{"role": "user", "content": "hi"}]
RETRIES = "hookbus_llm_retries_total"


class ChunkWatch(Skill):
    """Notes what every on_chunk hook call was given: (chunk_index, content)."""

    name = "chunk_watch"

    def __init__(self) -> None:
        self.seen: list[tuple[int | None, str | None]] = []

    @hook("on_chunk")
    async def note(self, data: HookData, ctx: Context) -> None:
        self.seen.append((data.chunk_index, data.content))


@pytest.fixture(scope="module")
def endpoint() -> Iterator[up.RecordingUpstream]:
    with up.RecordingUpstream() as server:
        yield server


@pytest.fixture(scope="module")
def watch() -> ChunkWatch:
    return ChunkWatch()


@pytest.fixture(scope="module")
async def gateway(redis_url: str, endpoint: up.RecordingUpstream, watch: ChunkWatch) -> AsyncIterator[RunningGateway]:
    """The agent offers its tool `add` on every call, so every call goes up under "auto"."""
    prefix = f"empty{uuid.uuid4().hex[:8]}:"
    agent = Agent(
        "empty", model=UPSTREAM_MODEL, skills=[Calc(), watch],
        llm=LLM(base_url=endpoint.url, api_key="sk-upstream", timeout=5.0),
    )
    async with running_stack(redis_url, prefix, agent), running_gateway(redis_url, prefix, models=[UPSTREAM_MODEL]) as gw:
        yield gw


@pytest.fixture
def double(endpoint: up.RecordingUpstream, watch: ChunkWatch) -> up.RecordingUpstream:
    endpoint.reset()
    watch.seen.clear()
    return endpoint


async def ask(gateway: RunningGateway, stream: bool) -> tuple[str, str, list[Any]]:
    """(completion id, text, chunks) of one request through the gateway."""
    async with openai.AsyncOpenAI(base_url=gateway.v1, api_key="sk-any", max_retries=0, timeout=30) as client:
        if not stream:
            completion = await client.chat.completions.create(model=UPSTREAM_MODEL, messages=HI)
            return completion.id, completion.choices[0].message.content or "", []
        response = await client.chat.completions.create(model=UPSTREAM_MODEL, messages=HI, stream=True)
        chunks = [c async for c in response]
    return chunks[0].id, "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks


async def metrics(gateway: RunningGateway) -> str:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
        return (await http.get("/metrics")).text


def count(text: str, name: str, **labels: str) -> float:
    return sample(text, name, **labels) or 0.0


async def counted_when_ended(gateway: RunningGateway, before: str, outcome: str) -> str:
    """/metrics once the request's own end record was read: the orchestrator wrote its
    LLM call records before it, so every retry of the request is counted by then."""

    async def ended() -> str | None:
        text = await metrics(gateway)
        grown = count(text, "hookbus_agent_requests_total", outcome=outcome) > count(
            before, "hookbus_agent_requests_total", outcome=outcome
        )
        return text if grown else None

    text = await wait_for(ended, timeout=10)
    assert text, "the request's end never reached /metrics"
    return str(text)


async def waterfall(gateway: RunningGateway, completion_id: str) -> list[dict[str, Any]]:
    """The steps of the request's waterfall in the console (loopback, auth off)."""

    async def ended() -> list[dict[str, Any]] | None:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
            response = await http.get(f"/console/api/requests/{completion_id}")
        body = response.json() if response.status_code == 200 else None
        return body["steps"] if body and body["request"]["outcome"] != "running" else None

    steps = await wait_for(ended, timeout=15, every=0.3)
    assert steps, f"no waterfall for {completion_id}"
    return list(steps)


def chat_calls(double: up.RecordingUpstream) -> list[tuple[Any, ...]]:
    """(method, path, stream, tool_choice) of every chat call the double saw."""
    return [
        (s.method, s.path, (s.body or {}).get("stream", False), (s.body or {}).get("tool_choice"))
        for s in double.seen if s.path.endswith("/chat/completions")
    ]


@pytest.mark.parametrize("said", ["", "functions.add:"])
@pytest.mark.parametrize("stream", [False, True])
async def test_an_empty_answer_under_auto_is_asked_again_with_none_and_the_client_gets_its_text(
    gateway, double, watch, stream, said
):
    """No text, or nothing but the marker of a call of the agent's tool `add`."""
    double.rule = up.says_nothing_under_auto(said)
    before = await metrics(gateway)
    completion_id, text, chunks = await ask(gateway, stream)
    assert text == up.DEFAULT_TEXT
    assert chat_calls(double) == [
        ("POST", "/v1/chat/completions", stream, "auto"), ("POST", "/v1/chat/completions", stream, "none"),
    ]
    assert [d["tools"][0]["function"]["name"] for d in double.received] == ["add", "add"]  # still offered
    after = await counted_when_ended(gateway, before, "ok")
    assert count(after, RETRIES, reason="empty_answer") - count(before, RETRIES, reason="empty_answer") == 1
    calls = [s for s in await waterfall(gateway, completion_id) if s["lifecycle"] in ("llm_retry", "llm_call")]
    assert [(s["lifecycle"], s["hooks"], s["outcome"]) for s in calls] == [
        ("llm_retry", [UPSTREAM_MODEL], "failed"), ("llm_call", [UPSTREAM_MODEL], "ok"),
    ]
    assert calls[0]["error"].startswith("empty_answer: the model's answer said nothing")
    assert calls[0]["error"].endswith("asked again with tool_choice none")
    if stream:
        # The empty answer's chunks reached neither the hooks nor the client: one role
        # chunk, one finish, and on_chunk's indexes run 0, 1, 2, ... over the second answer.
        roles = [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].delta.role]
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert (roles, finishes) == (["assistant"], ["stop"])
        assert [i for i, _ in watch.seen] == list(range(len(watch.seen)))
        assert "".join(c or "" for _, c in watch.seen) == up.DEFAULT_TEXT


@pytest.mark.parametrize("stream", [False, True])
async def test_an_empty_answer_to_the_second_call_too_is_a_502_empty_answer(gateway, double, stream):
    double.rule = up.always_empty
    before = await metrics(gateway)
    with pytest.raises(openai.APIError) as caught:
        await ask(gateway, stream)  # streamed: the error arrives in the stream
    error = caught.value
    assert getattr(error, "code", None) == "empty_answer" or (error.body or {}).get("code") == "empty_answer", error
    assert "no text and no tool call (finish_reason stop)" in str(error)
    assert [c[3] for c in chat_calls(double)] == ["auto", "none"]
    after = await counted_when_ended(gateway, before, "failed")
    assert count(after, RETRIES, reason="empty_answer") - count(before, RETRIES, reason="empty_answer") == 1

