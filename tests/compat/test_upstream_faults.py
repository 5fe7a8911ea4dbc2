"""An upstream that misbehaves: a stream cut off before its end, and garbage where an OpenAI
answer should be. The client gets a 502 with an upstream code and a message in words (an
in-stream error once the stream began), never a finished answer, never a 500, never a
Python exception's name; finalize_connection sees the failure.

The gateway's agent reaches a recording upstream (tests/compat/upstream.py, a real HTTP
server) scripted to misbehave; a finalize hook records what each request ended with.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from hookbus import Agent, Context, HookData, Skill, hook
from hookbus.services.orchestrator.llm.client import LLM
from tests.compat import upstream as up
from tests.compat.conftest import UPSTREAM_MODEL, function_tool
from tests.compat.upstream import RecordingUpstream
from tests.gateway.server import RunningGateway, running_gateway
from tests.integration.stack import running_stack
from tests.waiting import wait_for

PYTHON_NAMES = re.compile(r"Error\b|Exception\b|object has no attribute|Traceback|'list'|'dict'")
"""What a Python exception's text looks like; no client-facing error may contain it."""


class Finals(Skill):
    """Records each request's outcome as finalize_connection saw it, by the user's text (each
    test's own: an error answered before the stream began carries no completion id)."""

    name = "finals"

    def __init__(self) -> None:
        self.errors: dict[str, tuple[int, str] | None] = {}
        self.runs: list[str] = []

    @hook("finalize_connection")
    async def record(self, data: HookData, ctx: Context) -> None:
        asked = str(data.messages[0]["content"])
        self.runs.append(asked)
        self.errors[asked] = (data.error.status_code, data.error.code) if data.error else None


@pytest.fixture(scope="module")
def finals() -> Finals:
    return Finals()


@pytest.fixture(scope="module")
async def gateway(redis_url: str, upstream: RecordingUpstream, finals: Finals) -> AsyncIterator[RunningGateway]:
    prefix = f"upf{uuid.uuid4().hex[:8]}:"
    agent = Agent(
        "upstream-faults", model=UPSTREAM_MODEL, skills=[finals],
        llm=LLM(base_url=upstream.url, api_key="sk-upstream", timeout=2.0, retries=0),
    )
    async with running_stack(redis_url, prefix, agent), running_gateway(
        redis_url, prefix, models=[UPSTREAM_MODEL]
    ) as gw:
        yield gw


async def post(gateway: RunningGateway, stream: bool, **extra: Any) -> tuple[int, str, list[dict[str, Any]]]:
    """One chat request over raw HTTP with a text of its own: (status, that text, the JSON
    body or the SSE events)."""
    asked = f"hi {uuid.uuid4().hex}"
    body = {"model": UPSTREAM_MODEL, "messages": [{"role": "user", "content": asked}], "stream": stream, **extra}
    async with httpx.AsyncClient(timeout=20) as http:
        response = await http.post(f"{gateway.v1}/chat/completions", json=body)
    if not response.headers["content-type"].startswith("text/event-stream"):
        return response.status_code, asked, [response.json()]
    events = [
        json.loads(line.removeprefix("data: "))
        for line in response.text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    return response.status_code, asked, events


def finishes(events: list[dict[str, Any]]) -> list[str]:
    return [e["choices"][0]["finish_reason"] for e in events if e.get("choices") and e["choices"][0].get("finish_reason")]


def the_error(events: list[dict[str, Any]]) -> dict[str, Any]:
    (error,) = [event["error"] for event in events if "error" in event]
    return dict(error)


async def finalized_with(finals: Finals, asked: str) -> tuple[int, str] | None:
    """The (status, code) finalize_connection saw for the request that asked `asked`, once."""

    async def ran() -> bool:
        return asked in finals.errors

    assert await wait_for(ran, timeout=5), "finalize_connection did not run"
    assert finals.runs.count(asked) == 1, "finalize_connection ran more than once"
    return finals.errors[asked]


def _cut(chunks: list[dict[str, Any]]) -> up.Stream:
    """The stream of `chunks` with no finish_reason and no [DONE]: the body just closes."""
    return up.Stream([c for c in chunks if not any(ch.get("finish_reason") for ch in c.get("choices", ()))], done=False)


async def test_a_text_stream_cut_before_its_finish_is_an_in_stream_502_and_finalize_sees_it(gateway, recording, finals):
    recording.answer(_cut(up.text_stream("one two three", usage=False).chunks))
    status, asked, events = await post(gateway, stream=True)
    assert status == 200  # the text came first: the error is in the stream
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices")) == "one two three"
    assert finishes(events) == []
    error = the_error(events)
    assert error["code"] == "upstream_stream_truncated" and error["type"] == "server_error"
    assert await finalized_with(finals, asked) == (502, "upstream_stream_truncated")


async def test_a_tool_call_whose_arguments_stop_mid_json_is_never_delivered_as_a_call(gateway, recording, finals):
    recording.answer(_cut([
        up.chunk({"role": "assistant", "content": None}),
        up.chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                  "function": {"name": "lookup", "arguments": ""}}]}),
        up.chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q": "half'}}]}),
    ]))
    status, asked, events = await post(gateway, stream=True, tools=[function_tool("lookup")])
    calls = [e for e in events if e.get("choices") and e["choices"][0]["delta"].get("tool_calls")]
    assert calls == [] and finishes(events) == []
    body = events[0] if status != 200 else {"error": the_error(events)}
    assert status in (200, 502) and body["error"]["code"] == "upstream_stream_truncated"
    assert await finalized_with(finals, asked) == (502, "upstream_stream_truncated")


async def test_a_stream_with_its_finish_but_no_done_is_a_complete_answer(gateway, recording, finals):
    recording.answer(up.Stream(up.text_stream("all here").chunks, done=False))
    status, asked, events = await post(gateway, stream=True)
    assert status == 200 and not [e for e in events if "error" in e]
    assert finishes(events) == ["stop"]
    assert await finalized_with(finals, asked) is None


def _sse(*lines: bytes) -> up.Raw:
    return up.Raw(b"".join(b"data: " + line + b"\n\n" for line in lines), "text/event-stream")


_FIRST_CHUNK = json.dumps(up.chunk({"role": "assistant", "content": "one"})).encode()
GARBAGE = {
    "a line that is not JSON mid-stream": (True, _sse(_FIRST_CHUNK, b"{not json")),
    "a JSON array for a chunk": (True, _sse(_FIRST_CHUNK, b"[1, 2, 3]")),
    "a JSON object that is no chunk": (True, _sse(_FIRST_CHUNK, b'{"choices": "many"}')),
    # an empty stream is asked again unstreamed (hookbus.services.orchestrator.llm.client): HTML both times
    "HTML for a stream": (True, [up.Raw(b"<html><body>Bad gateway</body></html>", "text/html")] * 2),
    "HTML for an answer": (False, up.Raw(b"<html><body>Bad gateway</body></html>", "text/html")),
    "HTML labelled JSON": (False, up.Raw(b"<html><body>Bad gateway</body></html>")),
    "a JSON array for an answer": (False, up.Raw(b"[1, 2, 3]")),
    "a JSON object that is no completion": (False, up.Raw(b'{"choices": [{"message": 5}]}')),
}


@pytest.mark.parametrize("case", list(GARBAGE))
async def test_garbage_from_the_upstream_is_a_502_in_words_and_finalize_sees_it(gateway, recording, finals, case):
    stream, answer = GARBAGE[case]
    recording.answer(*(answer if isinstance(answer, list) else [answer]))
    status, asked, events = await post(gateway, stream=stream)
    error = the_error(events) if status == 200 else events[0]["error"]
    assert status in ((200, 502) if stream else (502,))
    assert error["type"] == "server_error" and error["code"].startswith(("upstream_", "empty_response"))
    assert not PYTHON_NAMES.search(json.dumps(error)), error
    assert "details" not in error or "exception" not in error["details"]
    assert (await finalized_with(finals, asked) or (0, ""))[0] == 502


@pytest.mark.parametrize("stream", [False, True], ids=["answer", "stream"])
async def test_an_answer_with_a_field_no_openai_model_accepts_is_still_an_answer(gateway, recording, finals, stream):
    """Validated cheaply, but not strictly: an endpoint's odd `object` (the models accept only
    OpenAI's) is built leniently, as the client builds everything, since its choices hold
    what a completion's or a chunk's do."""
    if stream:
        odd = [{**c, "object": "chat.completion.chunk.v9"} for c in up.text_stream("odd but fine").chunks]
        recording.answer(up.Stream(odd))
    else:
        recording.answer(up.Reply({**up.completion("odd but fine"), "object": "chat.completion.v9"}))
    status, asked, events = await post(gateway, stream=stream)
    assert status == 200, events
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices")) if stream else (
        events[0]["choices"][0]["message"]["content"])
    assert text == "odd but fine"
    assert await finalized_with(finals, asked) is None
