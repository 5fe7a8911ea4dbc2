"""The gateway's wire models: what a Chat Completions request may hold, and its answers.

The request model is lenient where OpenAI clients are (unknown fields such as
`temperature`, `top_p` or `n` are accepted and ignored; so are fields inside messages it
does not know) and strict where the queue needs it (a known role, at least one message,
tool messages that answer a preceding assistant `tool_calls`).

`tools`, `tool_choice` and the sampling fields a client sends are ignored: the agent's
skills decide which tools exist and the agent's model settings apply.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hookbus.services.openai_wire import Message, StreamOptions, tool_pairing_problem

SESSION_ID_MAX = 200


class ChatCompletionRequest(BaseModel):
    """The part of an OpenAI Chat Completions request the gateway reads."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"additionalProperties": True})

    model: str = Field(description="One of the names `GET /v1/models` lists.")
    messages: list[Message] = Field(min_length=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(
        default=None,
        max_length=SESSION_ID_MAX,
        description="Session id (ctx.session) unless the X-Session-Id header gives one.",
    )
    metadata: dict[str, str] | None = Field(
        default=None, description="Extra keys for ctx.metadata (reserved keys are ignored)."
    )

    @field_validator("messages")
    @classmethod
    def _tool_messages_answer_tool_calls(cls, messages: list[Message]) -> list[Message]:
        problem = tool_pairing_problem(messages)
        if problem is not None:
            raise ValueError(problem)
        return messages

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def message_dicts(self) -> list[dict[str, Any]]:
        return [m.model_dump(exclude_none=True) for m in self.messages]



class ErrorDetail(BaseModel):
    message: str
    type: str
    code: str | None = None
    param: str | None = None
    details: dict[str, Any] | None = None


class ErrorBody(BaseModel):
    """OpenAI's error body: `{"error": {message, type, code, param}}`."""

    error: ErrorDetail


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "hookbus"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    redis: str = Field(description="`ok` or why Redis could not be reached.")
    orchestrators: list[str] = Field(description="Orchestrators with a heartbeat in the last 10 s.")
    worker_groups: dict[str, int] = Field(
        default_factory=dict, description="Live replicas per announced worker group."
    )
