"""The OpenAI Responses API on the wire: what `POST /v1/responses` may hold, and its answers.

The shapes follow the official `openai` SDK's `openai.types.responses` (the tests validate
every object and stream event the gateway sends with those types). Only the part hookbus
serves is modelled:

- requests are lenient where clients are (unknown fields such as `include`, `reasoning`
  or `truncation` are accepted and ignored) and strict where a wrong value would change
  the answer: only `function` tools, only the input item types below, OpenAI's ranges for
  the sampling fields;
- answers carry `message` and `function_call` output items; text parts have no
  annotations and no logprobs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from hookbus.services.gateway.models import SESSION_ID_MAX

METADATA_KEYS_MAX = 16
METADATA_KEY_MAX = 64
METADATA_VALUE_MAX = 512
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", json_schema_extra={"additionalProperties": True})


# --------------------------------------------------------------------- request


class InputContent(_Lenient):
    """One content part of an input message: `input_text`, `output_text` and `refusal` are
    text; `input_image` becomes a Chat Completions `image_url` part."""

    type: Literal["input_text", "output_text", "refusal", "input_image"]
    text: str | None = None
    refusal: str | None = None
    image_url: str | None = None
    detail: str | None = None


class InputMessage(_Lenient):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputContent]
    id: str | None = None
    status: ItemStatus | None = None


class InputFunctionCall(_Lenient):
    """A call the model made earlier (a client sends it back with its output)."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None
    status: ItemStatus | None = None


class OutputTextPart(_Lenient):
    type: Literal["input_text", "output_text"]
    text: str


class InputFunctionCallOutput(_Lenient):
    """The client's result of a function call; the model sees it as a tool message."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[OutputTextPart]
    id: str | None = None
    status: ItemStatus | None = None


class InputReasoning(_Lenient):
    """A reasoning item a client echoes back; the Chat Completions model has no place for
    it, so it is accepted and left out."""

    type: Literal["reasoning"]


def _item_type(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("type") or "message")
    return str(getattr(value, "type", "message"))


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")]
    | Annotated[InputFunctionCall, Tag("function_call")]
    | Annotated[InputFunctionCallOutput, Tag("function_call_output")]
    | Annotated[InputReasoning, Tag("reasoning")],
    Discriminator(_item_type),
]


class FunctionTool(_Lenient):
    """A function the client runs itself (a client tool)."""

    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoiceFunction(_Lenient):
    type: Literal["function"]
    name: str = Field(min_length=1)


class TextFormat(_Lenient):
    """`text`, `json_object`, or `json_schema` with its `name` and `schema`."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, max_length=64)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    model_config = ConfigDict(populate_by_name=True)


class TextConfig(_Lenient):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(_Lenient):
    """The part of a Responses API request the gateway reads."""

    model: str = Field(description="One of the names `GET /v1/models` lists.")
    input: str | list[InputItem] | None = Field(
        default=None, description="Text (one user message) or a list of input items."
    )
    instructions: str | None = Field(
        default=None, description="A system message for this response only (not carried to the next)."
    )
    tools: list[FunctionTool] | None = Field(default=None, description="Function tools: client tools.")
    tool_choice: Literal["auto", "none", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    max_output_tokens: int | None = Field(default=None, ge=1)
    text: TextConfig | None = None
    metadata: dict[str, Annotated[str, Field(max_length=METADATA_VALUE_MAX)]] | None = Field(
        default=None, max_length=METADATA_KEYS_MAX,
        description="Echoed in the response and given to hooks as ctx.metadata (reserved keys are not).",
    )
    stream: bool | None = False
    store: bool | None = Field(default=True, description="Keep the response for GET and previous_response_id.")
    previous_response_id: str | None = Field(default=None, max_length=200)
    user: str | None = Field(
        default=None, max_length=SESSION_ID_MAX,
        description="Session id (ctx.session) unless the X-Session-Id header gives one.",
    )


# --------------------------------------------------------------------- answers


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus = "completed"
    content: list[OutputText] = Field(default_factory=list)


class OutputFunctionCall(BaseModel):
    """A call of a client tool: the client runs it and sends a `function_call_output`."""

    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str = ""
    status: ItemStatus = "completed"


OutputItem = Annotated[OutputMessage | OutputFunctionCall, Field(discriminator="type")]


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class Usage(BaseModel):
    """Summed over every LLM call of the request, the agent's own tool rounds included."""

    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int = 0


class ResponseError(BaseModel):
    """Why a response failed. `code` is one of OpenAI's response error codes; the hook's
    own code and status are in the stream's `error` event or the HTTP error body."""

    code: Literal["server_error", "rate_limit_exceeded", "invalid_prompt"]
    message: str


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseObject(BaseModel):
    """A Response: what `POST /v1/responses` answers, `GET /v1/responses/{id}` returns, and
    the `response` of the `response.*` lifecycle stream events."""

    id: str = Field(description="`resp_...`; also the completion id the hooks see.")
    object: Literal["response"] = "response"
    created_at: float
    status: Literal["completed", "failed", "in_progress", "cancelled", "incomplete"]
    completed_at: float | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    store: bool = True
    temperature: float | None = None
    text: TextConfig = Field(default_factory=lambda: TextConfig(format=TextFormat(type="text")))
    tool_choice: Literal["auto", "none", "required"] | ToolChoiceFunction = "auto"
    tools: list[FunctionTool] = Field(default_factory=list)
    top_p: float | None = None
    max_output_tokens: int | None = None
    user: str | None = None
    usage: Usage | None = None

    def output_text(self) -> str:
        return "".join(
            part.text for item in self.output if isinstance(item, OutputMessage) for part in item.content
        )


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: Literal[True] = True


# --------------------------------------------------------------- stream events


class StreamEvent(BaseModel):
    """One server-sent event; sent as `event: {type}` and `data: {the event as JSON}`."""

    type: str
    sequence_number: int


class ResponseLifecycleEvent(StreamEvent):
    """`response.created`, `response.in_progress`, `response.completed`,
    `response.incomplete` or `response.failed`: the response as it stands."""

    type: Literal[
        "response.created", "response.in_progress", "response.completed",
        "response.incomplete", "response.failed",
    ]
    response: ResponseObject


class OutputItemEvent(StreamEvent):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: OutputItem


class ContentPartEvent(StreamEvent):
    type: Literal["response.content_part.added", "response.content_part.done"]
    item_id: str
    output_index: int
    content_index: int = 0
    part: OutputText


class TextDeltaEvent(StreamEvent):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    item_id: str
    output_index: int
    content_index: int = 0
    delta: str
    logprobs: list[Any] = Field(default_factory=list)


class TextDoneEvent(StreamEvent):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    item_id: str
    output_index: int
    content_index: int = 0
    text: str
    logprobs: list[Any] = Field(default_factory=list)


class ArgumentsDeltaEvent(StreamEvent):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(StreamEvent):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    item_id: str
    output_index: int
    name: str
    arguments: str


class ErrorEvent(StreamEvent):
    """The run failed after the stream started: the hook's (or the gateway's) error."""

    type: Literal["error"] = "error"
    code: str | None = None
    message: str
    param: str | None = None
