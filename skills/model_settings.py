"""ModelSettings: the sampling and format fields of one LLM call.

One model for every place these values pass through: the gateway validates a client's
fields into it (OpenAI's ranges, so a bad value is OpenAI's 400), the request envelope
carries it, the agent merges its own defaults and pins around it, and `before_llm_call`
hooks read and change it as `data.model_settings`. Every field left None is not sent, so
the endpoint's own default applies.

Where a value applies: every field reaches every LLM call of the request (each tool
round and the final answer), `max_tokens` / `max_completion_tokens` bound each call on
its own, and `response_format` is sent with the tools (OpenAI, vLLM and llama.cpp take
both together). The exception is a forcing `tool_choice` (`"required"` or a named
function): it applies to the request's first LLM call only, later rounds get `"auto"`,
since forcing every round would make a server-side tool loop run to the round cap.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ToolChoice = Literal["none", "auto", "required"] | dict[str, Any]


class ModelSettings(BaseModel):
    """The settings of one LLM call; None means "the endpoint's default"."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, int] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    user: str | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > 4:
            raise ValueError(f"at most 4 stop sequences are allowed, got {len(stop)}")
        return stop

    @field_validator("logit_bias")
    @classmethod
    def _bias_in_range(cls, bias: dict[str, int] | None) -> dict[str, int] | None:
        for token, value in (bias or {}).items():
            if not -100 <= value <= 100:
                raise ValueError(f"logit_bias[{token}] is {value}; each bias must be in [-100, 100]")
        return bias

    @field_validator("response_format")
    @classmethod
    def _known_format(cls, fmt: dict[str, Any] | None) -> dict[str, Any] | None:
        if fmt is None:
            return None
        kind = fmt.get("type")
        if kind not in ("text", "json_object", "json_schema"):
            raise ValueError(
                f"response_format.type is {kind!r}; expected 'text', 'json_object' or 'json_schema'"
            )
        if kind == "json_schema":
            schema = fmt.get("json_schema")
            if not isinstance(schema, dict) or not schema.get("name"):
                raise ValueError("response_format json_schema needs json_schema.name")
        return fmt

    @field_validator("tool_choice")
    @classmethod
    def _named_function(cls, choice: ToolChoice | None) -> ToolChoice | None:
        if isinstance(choice, dict):
            function = choice.get("function")
            if choice.get("type") != "function" or not isinstance(function, dict) or not function.get("name"):
                raise ValueError(
                    "tool_choice must be 'none', 'auto', 'required' or "
                    '{"type": "function", "function": {"name": ...}}'
                )
        return choice

    def given(self) -> dict[str, Any]:
        """The fields that were set (not None), as the endpoint's request takes them."""
        return self.model_dump(exclude_none=True)

    def merged(self, *overrides: ModelSettings | None) -> ModelSettings:
        """These settings with each override's given fields laid over them, in order."""
        fields = self.given()
        for override in overrides:
            if override is not None:
                fields.update(override.given())
        return ModelSettings.model_validate(fields)

    @property
    def forces_tool(self) -> bool:
        """Whether `tool_choice` makes the model call a tool (required, or a named function)."""
        return self.tool_choice == "required" or isinstance(self.tool_choice, dict)


def as_model_settings(value: ModelSettings | dict[str, Any] | None) -> ModelSettings | None:
    """A ModelSettings from a model or its dict form (validated: a bad value raises at once)."""
    if value is None or isinstance(value, ModelSettings):
        return value
    return ModelSettings.model_validate(value)
