"""The OpenAI Chat Completions message shapes hookbus reads on its HTTP edges.

Shared by the gateway (what clients send) and the built-in offline model (what the agent
sends it). Lenient on purpose: OpenAI adds fields all the time, and an unknown one must
not turn a valid request into a 400.
"""

from __future__ import annotations

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
