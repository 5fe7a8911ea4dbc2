"""Client tools: the tools a request brings, which the client runs itself.

A request's `tools` are offered to the model together with the agent's own (a client tool
overrides an agent tool of the same name). When the model calls a client tool, the run
ends and the call goes back to the client (`finish_reason: "tool_calls"`); the client runs
it and sends the result in its next request.

A response that mixes server and client calls: the server's calls run in the agent (with
their hooks), the client's are returned. The client then sends back the assistant message
as it got it (with only its own calls) and its results; the model must still see the
server's calls and results, or their work is silently lost. So when the run returns
client calls, the server's calls and results are **held** (the runtime keeps them: in
Redis on the bus, in memory in-process, keyed by the caller's `peer_user_id` and each
returned call id, for a day), and every later request whose history contains that
assistant message gets them spliced back in (the full list of calls in the model's order,
the server's tool messages right after it) before `on_connection`. A caller never gets
another principal's held results: the key carries the principal.

`run_outcome` turns a finished run into what any API route needs: the final text and the
client tool calls (reused by the Responses API route).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from openai.types.chat import ChatCompletion, ChatCompletionMessage
from pydantic import BaseModel, Field


class HoldingRuntime(Protocol):
    async def hold_tool_results(self, key: str, record: dict[str, Any]) -> None: ...

    async def held_tool_results(self, keys: Sequence[str]) -> list[dict[str, Any] | None]: ...


def call_name(tool_call: Mapping[str, Any]) -> str:
    return str((tool_call.get("function") or {}).get("name", ""))


def tool_name(schema: Mapping[str, Any]) -> str:
    return str((schema.get("function") or {}).get("name", ""))


def client_tool_names(client_tools: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    return frozenset(tool_name(t) for t in client_tools)


def offered_tools(
    own: Sequence[dict[str, Any]], client: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The agent's tools and the client's; a client tool replaces an agent tool of its name."""
    names = client_tool_names(client)
    return [t for t in own if tool_name(t) not in names] + [copy.deepcopy(t) for t in client]


def conversation_message(message: ChatCompletionMessage) -> dict[str, Any]:
    """The assistant message as the conversation keeps it: OpenAI's current form, no
    legacy `function_call`, `content` present (None when only tool calls came)."""
    kept = message.model_dump(exclude_none=True, exclude={"function_call", "audio"})
    kept.setdefault("content", None)
    return kept


def returned_message(content: str | None, client_calls: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The final assistant message for the client: its text and only its own tool calls."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if client_calls:
        message["tool_calls"] = [copy.deepcopy(c) for c in client_calls]
    return message


def _key(peer_user_id: str | None, call_id: str) -> str:
    return f"{peer_user_id or '-'}:{call_id}"


async def hold_results(
    runtime: HoldingRuntime,
    peer_user_id: str | None,
    assistant: dict[str, Any],
    returned: Sequence[dict[str, Any]],
    results: Sequence[dict[str, Any]],
) -> None:
    """Keep the server's side of a mixed response for the client's next request.

    Nothing to hold when every call of the response was the client's."""
    if len(returned) == len(assistant.get("tool_calls") or ()):
        return
    record = {
        "client_ids": [str(c.get("id", "")) for c in returned],
        "tool_calls": copy.deepcopy(assistant["tool_calls"]),
        "results": [copy.deepcopy(dict(r)) for r in results],
    }
    for call in returned:
        await runtime.hold_tool_results(_key(peer_user_id, str(call.get("id", ""))), record)


async def restore_held_results(
    runtime: HoldingRuntime, peer_user_id: str | None, conversation: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`conversation` with every held server call and result spliced back in."""
    places = [
        (i, str(m["tool_calls"][0].get("id", "")))
        for i, m in enumerate(conversation)
        if m.get("role") == "assistant" and m.get("tool_calls")
    ]
    if not places:
        return conversation
    records = await runtime.held_tool_results([_key(peer_user_id, cid) for _, cid in places])
    restored = list(conversation)
    for (index, _), record in sorted(zip(places, records, strict=True), reverse=True):
        message = restored[index]
        sent_ids = [str(c.get("id", "")) for c in message["tool_calls"]]
        if record is None or sent_ids != record["client_ids"]:
            continue
        restored[index] = {**message, "tool_calls": record["tool_calls"]}
        restored[index + 1 : index + 1] = record["results"]
    return restored


class RunOutcome(BaseModel):
    """What a finished run answers: its text and the calls the client must run."""

    text: str | None = None
    client_tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    finish_reason: str = "stop"


def run_outcome(completion: ChatCompletion) -> RunOutcome:
    """The outcome of `Agent.run`'s completion, for an API route other than Chat Completions."""
    choice = completion.choices[0]
    calls = [c.model_dump(exclude_none=True) for c in choice.message.tool_calls or ()]
    return RunOutcome(text=choice.message.content, client_tool_calls=calls, finish_reason=choice.finish_reason)
