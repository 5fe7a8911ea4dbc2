"""A raw SSE client: plain httpx POSTs, the `data:` lines parsed here, no OpenAI library.

What a hand-written client relies on: one role delta, the text, exactly one finish chunk,
then `data: [DONE]`; SSE comment lines (the server tools' progress) are skipped as the SSE
format says; tool-call deltas only for the client's own tools, assembled by `index`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.compat import upstream as up
from tests.compat.conftest import (
    AGENT_RULES,
    TOOL_CHOICE_CASES,
    UPSTREAM_MODEL,
    function_tool,
    tool_choice_prompt,
)
from tests.compat.test_upstream import EVERY_PARAMETER

LOOKUP = function_tool("lookup")


@dataclass
class Sse:
    """A parsed event stream: the JSON of each `data:` event, the comment lines, and
    whether `[DONE]` came as the last event."""

    events: list[dict[str, Any]] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    done: bool = False

    @property
    def deltas(self) -> list[dict[str, Any]]:
        return [event["choices"][0]["delta"] for event in self.events if event.get("choices")]

    @property
    def finishes(self) -> list[str]:
        return [c["finish_reason"] for e in self.events for c in e.get("choices", ()) if c.get("finish_reason")]

    @property
    def text(self) -> str:
        return "".join(delta.get("content") or "" for delta in self.deltas)

    def tool_calls(self) -> list[dict[str, Any]]:
        """The tool calls of the deltas, assembled by `index` as OpenAI streams them."""
        calls: dict[int, dict[str, Any]] = {}
        for delta in self.deltas:
            for part in delta.get("tool_calls") or ():
                call = calls.setdefault(part["index"], {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                call["id"] = part.get("id") or call["id"]
                function = part.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
        return [calls[i] for i in sorted(calls)]


async def parse_sse(lines: AsyncIterator[str]) -> Sse:
    """Events end at a blank line; `data:` lines of one event are joined with newlines; a
    line starting with `:` is a comment. Anything after `[DONE]` fails the parse."""
    sse = Sse()
    data: list[str] = []
    async for line in lines:
        if line.startswith(":"):
            sse.comments.append(line[1:].strip())
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif not line and data:
            assert not sse.done, f"an event after [DONE]: {data}"
            payload = "\n".join(data)
            data = []
            if payload == "[DONE]":
                sse.done = True
            else:
                sse.events.append(json.loads(payload))
    assert not data, f"an event without its closing blank line: {data}"
    return sse


async def stream(gateway, body: dict[str, Any]) -> Sse:
    async with httpx.AsyncClient(timeout=30) as http, http.stream(
        "POST", f"{gateway.v1}/chat/completions", json={**body, "stream": True}
    ) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        return await parse_sse(response.aiter_lines())


async def post(gateway, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.post(f"{gateway.v1}/chat/completions", json=body)


def ask(content: str, model: str = "offline", **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **fields}


def assert_one_turn(sse: Sse, finish: str) -> None:
    """One completion's chunks: one id, one role delta first, one finish, then [DONE]."""
    assert {(e["id"], e["object"]) for e in sse.events} == {(sse.events[0]["id"], "chat.completion.chunk")}
    assert [d["role"] for d in sse.deltas if d.get("role")] == ["assistant"]
    assert sse.deltas[0].get("role") == "assistant"
    assert sse.finishes == [finish]
    assert sse.done


async def test_a_streamed_server_tool_round_is_one_turn_and_its_progress_comments_are_skipped(offline_gateway):
    sse = await stream(offline_gateway, ask('[[tool:add {"a": 1, "b": 2}]] [[tool:add {"a": 3, "b": 4}]]'))
    assert_one_turn(sse, "stop")
    assert not sse.tool_calls()
    assert sse.text == "The tool add returned: 3\nThe tool add returned: 7"
    assert sse.comments == ["hookbus: tool add running", "hookbus: tool add done"] * 2


async def test_a_non_streamed_server_tool_round_is_one_json_answer(offline_gateway):
    response = await post(offline_gateway, ask('[[tool:add {"a": 2, "b": 2}]]'))
    assert response.status_code == 200
    (choice,) = response.json()["choices"]
    assert choice["finish_reason"] == "stop" and not choice["message"].get("tool_calls")
    assert choice["message"]["content"] == "The tool add returned: 4"


async def test_a_client_tool_call_streams_as_deltas_and_its_result_continues_the_turn(offline_gateway):
    messages = [{"role": "user", "content": '[[tool:lookup {"q": "weather"}]]'}]
    asked = await stream(offline_gateway, {"model": "offline", "messages": messages, "tools": [LOOKUP]})
    assert_one_turn(asked, "tool_calls")
    (call,) = asked.tool_calls()
    assert call["id"] and call["function"]["name"] == "lookup"
    assert json.loads(call["function"]["arguments"]) == {"q": "weather"}
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "sunny"},
    ]
    answer = await stream(offline_gateway, {"model": "offline", "messages": messages, "tools": [LOOKUP]})
    assert_one_turn(answer, "stop")
    assert answer.text == "The tool lookup returned: sunny"


async def test_a_client_tool_call_in_a_json_answer_and_its_result_continue_the_turn(offline_gateway):
    messages = [{"role": "user", "content": '[[tool:lookup {"q": "snow"}]]'}]
    asked = (await post(offline_gateway, {"model": "offline", "messages": messages, "tools": [LOOKUP]})).json()
    (choice,) = asked["choices"]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("lookup", {"q": "snow"})
    messages += [choice["message"], {"role": "tool", "tool_call_id": call["id"], "content": "deep"}]
    answer = (await post(offline_gateway, {"model": "offline", "messages": messages, "tools": [LOOKUP]})).json()
    assert answer["choices"][0]["message"]["content"] == "The tool lookup returned: deep"


async def test_a_streamed_mixed_response_returns_the_client_call_and_keeps_the_server_result(offline_gateway):
    messages = [{"role": "user", "content": '[[tool:add {"a": 20, "b": 22}]] [[tool:lookup {"q": "x"}]]'}]
    asked = await stream(offline_gateway, {"model": "offline", "messages": messages, "tools": [LOOKUP]})
    assert_one_turn(asked, "tool_calls")
    (call,) = asked.tool_calls()
    assert call["function"]["name"] == "lookup"
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "found"},
    ]
    answer = await stream(offline_gateway, {"model": "offline", "messages": messages, "tools": [LOOKUP]})
    assert answer.text == "The tool add returned: 42\nThe tool lookup returned: found"


@TOOL_CHOICE_CASES
async def test_tool_choice_and_parallel_tool_calls_are_honoured(offline_gateway, options, expected):
    sse = await stream(offline_gateway, ask(tool_choice_prompt(options), tools=[LOOKUP, function_tool("other")], **options))
    assert [c["function"]["name"] for c in sse.tool_calls()] == expected
    assert_one_turn(sse, "tool_calls" if expected else "stop")


async def test_every_parameter_and_the_system_text_reach_the_model(upstream_gateway, recording):
    body = {
        "model": UPSTREAM_MODEL,
        "messages": [{"role": "system", "content": "Client system."}, {"role": "user", "content": "hi"}],
        "tools": [LOOKUP], "tool_choice": "required", "parallel_tool_calls": False, **EVERY_PARAMETER,
    }
    sse = await stream(upstream_gateway, body)
    assert_one_turn(sse, "stop")
    assert sse.text == up.DEFAULT_TEXT
    (sent,) = recording.received
    for name, value in {**EVERY_PARAMETER, "tool_choice": "required", "parallel_tool_calls": False}.items():
        assert sent[name] == value, name
    assert sent["messages"][0] == {"role": "system", "content": f"{AGENT_RULES}\n\nClient system."}


async def test_a_streamed_request_gets_an_upstream_429_as_an_http_429_with_retry_after(upstream_gateway, recording):
    recording.answer(up.error(429, "Slow down", "rate_limit_exceeded", headers={"Retry-After": "4"}))
    async with httpx.AsyncClient(timeout=30) as http, http.stream(
        "POST", f"{upstream_gateway.v1}/chat/completions", json=ask("hi", UPSTREAM_MODEL, stream=True)
    ) as response:
        body = json.loads(await response.aread())
    assert response.status_code == 429
    assert response.headers["retry-after"] == "4"
    assert (body["error"]["message"], body["error"]["code"]) == ("Slow down", "rate_limit_exceeded")
