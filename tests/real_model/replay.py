"""A failing call's exact upstream requests, replayed straight to the model server.

The recording hop (tests/real_model/recording_proxy.py) keeps what hookbus sent and what
the server answered it; a case that failed through hookbus sends the same bytes again with
nothing of hookbus in the way. An empty answer there too is the model's; an answer there
is one hookbus lost. Answers are read as the server sent them: a JSON completion, or a
stream of server-sent events.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from tests.real_model.recording_proxy import Exchange

SAMPLED_REPLAYS = 3


@dataclass(frozen=True)
class Answer:
    """What one upstream answer said: its text and its tool calls (`name arguments`)."""

    text: str
    tool_calls: tuple[str, ...] = ()
    error: str = ""

    @property
    def said_something(self) -> bool:
        return bool(self.text.strip() or self.tool_calls)

    def shown(self) -> str:
        if self.error:
            return self.error
        calls = f" calls {list(self.tool_calls)}" if self.tool_calls else ""
        return f"{self.text.strip()[:80]!r}{calls}"


def answer_of(status: int, raw: bytes) -> Answer:
    """The text and tool calls of a recorded answer; the error body when it is not a 200."""
    body = raw.decode("utf-8", "replace")
    if status != 200:
        return Answer("", error=f"HTTP {status} {body.strip()[:120]!r}")
    if body.lstrip().startswith("{"):
        message = (json.loads(body).get("choices") or [{}])[0].get("message") or {}
        return Answer(message.get("content") or "", tuple(_call_of(c) for c in message.get("tool_calls") or []))
    text: list[str] = []
    calls: dict[int, tuple[str, str]] = {}
    for line in body.splitlines():
        data = line.removeprefix("data:").strip()
        if not line.startswith("data:") or data == "[DONE]":
            continue
        for choice in json.loads(data).get("choices") or []:
            delta = choice.get("delta") or {}
            text.append(delta.get("content") or "")
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                name, arguments = calls.get(call.get("index", 0), ("", ""))
                calls[call.get("index", 0)] = (name + (function.get("name") or ""), arguments + (function.get("arguments") or ""))
    return Answer("".join(text), tuple(f"{name} {arguments}" for name, arguments in calls.values()))


def _call_of(call: dict[str, Any]) -> str:
    function = call.get("function") or {}
    return f"{function.get('name', '')} {function.get('arguments', '')}"


def failing_call(exchanges: list[Exchange]) -> list[Exchange]:
    """The requests of the call a failed case ended on: its last, with those right before
    it that asked the same messages (hookbus asking an empty answer again, with
    `tool_choice: "none"` or unstreamed, is the same call)."""
    if not exchanges:
        return []
    messages = _request(exchanges[-1]).get("messages")
    first = len(exchanges) - 1
    while first > 0 and _request(exchanges[first - 1]).get("messages") == messages:
        first -= 1
    return exchanges[first:]


def replays_of(exchange: Exchange) -> int:
    """How often to replay a request: once at temperature 0 (the same answer every time),
    else `SAMPLED_REPLAYS` times: the server samples it, and one answer says little of the
    others."""
    return 1 if _request(exchange).get("temperature") == 0 else SAMPLED_REPLAYS


def described(exchange: Exchange) -> str:
    """The request in a few words, for the check's line: what hookbus asked."""
    request = _request(exchange)
    temperature = request.get("temperature", "the server's default")
    tools = request.get("tools") or []
    offered = f"{len(tools)} tools, tool_choice {request.get('tool_choice')!r}" if tools else "no tools"
    last = (request.get("messages") or [{}])[-1]
    return (f"{len(request.get('messages') or [])} messages ending {last.get('role')} "
            f"{str(last.get('content') or '')[:48]!r}, {offered}, {'streamed' if request.get('stream') else 'not streamed'}, "
            f"temperature {temperature}")


def replay(exchange: Exchange, server: str) -> Answer:
    """The exchange's request body, byte for byte, to the server at `server` (scheme, host
    and port), and the server's answer to it."""
    request = urllib.request.Request(
        server + exchange.path, data=exchange.body, method="POST",
        headers={"Content-Type": "application/json", "Authorization": "Bearer local"},
    )
    try:
        with urllib.request.urlopen(request, timeout=900) as answer:
            return answer_of(answer.status, answer.read())
    except urllib.error.HTTPError as refused:
        return answer_of(refused.code, refused.read())


def _request(exchange: Exchange) -> dict[str, Any]:
    request = json.loads(exchange.body or b"{}")
    return request if isinstance(request, dict) else {}
