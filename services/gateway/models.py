"""The gateway's wire models: what a Chat Completions request may hold, and its answers.

The request model is lenient where OpenAI clients are (fields it does not know are
accepted and ignored; so are fields inside messages it does not know) and strict where
OpenAI is: a known role, at least one message, tool messages that answer a preceding
assistant `tool_calls`, and the sampling fields in OpenAI's ranges (temperature 5 or n 0
is OpenAI's 400; `n` > 1 is a 400 saying why).

`tools` are the client's own tools (hookbus.services.orchestrator.loop.client_tools); the
sampling and format fields (hookbus.skills.model_settings) reach the LLM calls. An
`allowed_tools` tool_choice is narrowed to the plain forms first
(hookbus.services.gateway.allowed_tools).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hookbus.services.gateway.allowed_tools import (
    is_allowed_tools,
    narrow_allowed_tools,
    parse_allowed_tools,
)
from hookbus.services.gateway.openai_wire import Message, StreamOptions, tool_pairing_problem
from hookbus.skills.model_settings import ModelSettings

SESSION_ID_MAX = 200


class FunctionTool(BaseModel):
    """One client tool: OpenAI's `{"type": "function", "function": {name, description, parameters}}`."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"]
    function: dict[str, Any]

    @field_validator("function")
    @classmethod
    def _named(cls, function: dict[str, Any]) -> dict[str, Any]:
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError("a function tool needs function.name")
        return function


class ChatCompletionRequest(ModelSettings):
    """The part of an OpenAI Chat Completions request the gateway reads."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"additionalProperties": True})

    model: str = Field(description="One of the names `GET /v1/models` lists.")
    messages: list[Message] = Field(min_length=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    tools: list[FunctionTool] | None = Field(
        default=None, description="Client tools: a call to one is returned (finish_reason tool_calls)."
    )
    n: int | None = Field(default=None, ge=1, description="Only 1: one agent turn per request.")
    user: str | None = Field(
        default=None,
        max_length=SESSION_ID_MAX,
        description="Session id (ctx.session) unless the X-Session-Id header gives one; also sent to the LLM.",
    )
    metadata: dict[str, str] | None = Field(
        default=None, description="Extra keys for ctx.metadata (reserved keys are ignored)."
    )

    @model_validator(mode="before")
    @classmethod
    def _allowed_tools_narrowed(cls, document: Any) -> Any:
        return narrow_allowed_tools(document) if isinstance(document, dict) else document

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _allowed_tools_well_formed(cls, choice: Any) -> Any:
        if is_allowed_tools(choice):  # still here: malformed, so not narrowed
            parse_allowed_tools(choice)
        return choice

    @field_validator("messages")
    @classmethod
    def _tool_messages_answer_tool_calls(cls, messages: list[Message]) -> list[Message]:
        problem = tool_pairing_problem(messages)
        if problem is not None:
            raise ValueError(problem)
        return messages

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int | None) -> int | None:
        if n is not None and n > 1:
            raise ValueError(
                f"n={n} is not supported: an agent runs one turn per request (its tools and "
                "hooks run once); send n separate requests for n answers"
            )
        return n

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def message_dicts(self) -> list[dict[str, Any]]:
        return [m.model_dump(exclude_none=True) for m in self.messages]

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

    def model_settings(self) -> ModelSettings:
        """The sampling and format fields the client gave."""
        return ModelSettings.model_validate(
            {name: getattr(self, name) for name in ModelSettings.model_fields}
        )


class ErrorDetail(BaseModel):
    message: str
    type: str
    code: str | None = None
    param: str | None = None
    details: dict[str, Any] | None = None


class ErrorBody(BaseModel):
    """OpenAI's error body: `{"error": {message, type, code, param}}`."""

    error: ErrorDetail


MODEL_CREATED = 1_735_689_600
"""`created` of every model card (2025-01-01 UTC): the same from every gateway replica and
after every restart, since clients compare and cache model cards."""


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "hookbus"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    """`/healthz`: anyone gets `status`; the details need an API key (or auth off)."""

    status: Literal["ok", "unavailable"]
    redis: str | None = Field(default=None, description="`ok` or why Redis could not be reached.")
    orchestrators: list[str] | None = Field(
        default=None, description="Orchestrators with a heartbeat in the last 10 s."
    )
    worker_groups: dict[str, int] | None = Field(
        default=None, description="Live replicas per announced worker group."
    )
