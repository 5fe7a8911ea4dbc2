"""HookData: what one lifecycle point hands to its hooks.

One model for every point keeps hooks simple to write (a hook for several points reads
the same fields), while `lifecycle` says which fields are meaningful and writable there.
Assigning a field that is read-only at this point raises an AttributeError that names
the writable ones, so a hook learns of the mistake at once instead of being ignored.
"""

from __future__ import annotations

from typing import Annotated, Any

from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, WithJsonSchema

from hookbus.skills.compaction_outcome import Compaction
from hookbus.skills.errors import HookbusError
from hookbus.skills.lifecycle import WRITABLE, Lifecycle
from hookbus.skills.model_settings import ModelSettings


def _load_error(value: Any) -> HookbusError | None:
    if value is None or isinstance(value, HookbusError):
        return value
    if isinstance(value, dict):
        return HookbusError.from_dict(value)
    raise TypeError(f"error must be a HookbusError or its dict form, not {type(value).__name__}")


def _dump_error(value: HookbusError | None) -> dict[str, Any] | None:
    return None if value is None else value.to_dict()


def _unset(value: object) -> bool:
    return value is None


ERROR_JSON_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {
            "type": "object",
            "description": "A HookbusError as it travels: `HookbusError.to_dict()`.",
            "properties": {
                "type": {"type": "string", "description": "hookbus's error class, e.g. HookError, PaymentRequired, Cancelled."},
                "status_code": {"type": "integer"},
                "code": {"type": "string"},
                "message": {"type": "string"},
                "details": {"description": "Anything JSON, or null."},
            },
            "required": ["status_code"],
        },
        {"type": "null"},
    ],
    "default": None,
}

ErrorField = Annotated[
    HookbusError | None,
    BeforeValidator(_load_error),
    PlainSerializer(_dump_error),
    WithJsonSchema(ERROR_JSON_SCHEMA),
]


class HookData(BaseModel):
    """The stage's data; see hookbus.skills.lifecycle.WRITABLE for what each point may change."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    lifecycle: Lifecycle
    # on_connection, before_llm_call, on_message, finalize_connection
    messages: list[dict[str, Any]] | None = None
    stream: bool | None = None
    # before_llm_call
    tools: list[dict[str, Any]] | None = None
    model_settings: ModelSettings | None = None
    iteration: int | None = None
    # after_llm_call
    response: ChatCompletion | None = None
    usage: CompletionUsage | None = None
    # on_chunk
    chunk: ChatCompletionChunk | None = None
    content: str | None = None
    chunk_index: int | None = None
    full_content: str | None = None
    held: str | None = Field(default=None, exclude_if=_unset)
    """With a hold-back window: the text that passed the hooks before this chunk and the
    client has not received; a hook may rewrite it (None: no window)."""
    # before_toolcall, after_toolcall
    tool_call: dict[str, Any] | None = None
    tool_id: str | None = None
    tool_skipped: bool = False
    client_tool: bool = False
    tool_result: str | None = None
    # finalize_connection
    error: ErrorField = None
    # on_compaction: what the compaction did; True when no request is running (ctx then
    # holds no request's auth, session or state). Left out of the JSON when unset, so the
    # other points' data is on the wire as before on_compaction became a stage.
    compaction: Compaction | None = Field(default=None, exclude_if=_unset)
    between_turns: bool | None = Field(default=None, exclude_if=_unset)

    def __setattr__(self, name: str, value: Any) -> None:
        writable = WRITABLE.get(self.lifecycle)
        if writable is not None and name not in writable and name in type(self).model_fields:
            allowed = ", ".join(sorted(writable)) or "nothing"
            raise AttributeError(
                f"HookData.{name} is read-only at {self.lifecycle}; a hook may change: {allowed}"
            )
        super().__setattr__(name, value)

    def set_internal(self, **fields: Any) -> None:
        """Assign fields as the runtime (not a hook), bypassing the per-lifecycle guard."""
        for name, value in fields.items():
            BaseModel.__setattr__(self, name, value)
