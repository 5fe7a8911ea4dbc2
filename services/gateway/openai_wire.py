"""The OpenAI Chat Completions message shapes hookbus reads on its HTTP edges.

Shared by the gateway (what clients send) and the built-in offline model (what the agent
sends it). Lenient on purpose: OpenAI adds fields all the time, and an unknown one must
not turn a valid request into a 400.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Lenient(BaseModel):
    """Keeps fields it does not know."""

    model_config = ConfigDict(extra="allow")


class ContentPart(Lenient):
    type: str = Field(description="`text` for text; other part types are passed through.")
    text: str | None = None


class FunctionCall(Lenient):
    name: str
    arguments: str = ""


class ToolCall(Lenient):
    id: str
    type: str = "function"
    function: FunctionCall


class Message(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class StreamOptions(Lenient):
    include_usage: bool | None = Field(
        default=None, description="Send one last chunk with no choices carrying the usage."
    )


def tool_pairing_problem(messages: Sequence[Message]) -> str | None:
    """Why the tool messages do not pair up with the assistant tool calls, as the OpenAI API says."""
    pending: list[str] = []
    for message in messages:
        if message.role == "tool":
            if message.tool_call_id not in pending:
                return (
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceding message with 'tool_calls'."
                )
            pending.remove(message.tool_call_id)
            continue
        if pending:
            break
        if message.role == "assistant" and message.tool_calls:
            pending = [call.id for call in message.tool_calls]
    if pending:
        return (
            "An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each 'tool_call_id'. The following tool_call_ids did not have "
            f"response messages: {', '.join(pending)}"
        )
    return None
