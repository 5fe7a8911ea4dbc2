"""Versioned envelopes: every entry on every hookbus stream is one of these models.

An entry carries a field `e` holding the envelope's JSON. A consumer that cannot
decode an entry (not JSON, wrong shape, unknown version) moves it to the dead-letter
stream with the reason and goes on (hookbus.bus.groups.dead_letters).

Hook hops use the split format (envelope version 2, `encode_hop` / `encode_reply`): the
stage data and the context travel as their own entry fields, `d` (HookData JSON) and `c`
(Context JSON), each dumped once from its model and validated once into it, and `e` keeps
only the routing fields (its `data` is absent and its `ctx` is `{}`). A reply carries `d`
only when the hooks changed the data, so a hook that only looks costs no data on the way
back. Tool hops, and all other envelopes, are version 1 (everything in
`e`); HopEvent and HopReply decode both versions.

A batched on_chunk hop (`HopEvent.chunks` > 0, version 2) carries several chunks of one
stream in one hop: `d` is a JSON array of that many on_chunk HookData in the model's
order, each without the fields at their default values (hookbus.bus.wire.chunk_batch),
`full_content` only on the first (each next one's is the previous one's plus its own
`content`: the worker rebuilds it, so a batch does not carry the text so far once per
chunk). From protocol 1.1 (`HopEvent.text` set) a batch carries no text so far at all:
the worker keeps each stream's text, a chunk's `content` is left out when it is the
chunk's own text, and a replica that lacks the text answers `needs_text`
(hookbus.bus.wire.stream_text). The worker runs the chain over them one after another, so every hook sees the
state the previous chunk left. Its reply says how many it ran (`processed`: all of them,
unless a HookError stopped the chain at the last one) and, when any changed, has `d` as a
JSON array with one item per processed chunk: the changed HookData, or null for a chunk
the hooks left unchanged. A worker of an older build answers a batch with a failure, so
upgrade workers before orchestrators.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.json_schema import SkipJsonSchema

from hookbus.bus.wire.stream_text import ChunkText
from hookbus.bus.wire.tracecontext import TraceCarrier
from hookbus.skills.context import AuthInfo
from hookbus.skills.model_settings import ModelSettings
from hookbus.skills.outcome import Outcome

if TYPE_CHECKING:
    from hookbus.skills.runner import HookOutcome

VERSION = 1
SPLIT_VERSION = 2
"""The split hop format: HookData and Context in entry fields `d` and `c`."""
FIELD = b"e"
DATA_FIELD = b"d"
CTX_FIELD = b"c"


class Envelope(BaseModel):
    model_config = ConfigDict(extra="ignore")

    versions: ClassVar[frozenset[int]] = frozenset({VERSION})

    v: int = VERSION


class RequestEnvelope(Envelope):
    """A client's request on `requests` (or its agent's `requests:<agent>`); the client
    picks the completion id."""

    kind: Literal["request"] = "request"
    completion_id: str = Field(min_length=1, max_length=200)
    agent: str | None = Field(
        default=None, max_length=64,
        description="The agent the request is for (its stream's); none: whichever agent the orchestrator serves first.",
    )
    model: str | None = Field(
        default=None, max_length=200,
        description="A model the agent allows (`<agent>/<model>`) for this request's LLM calls; none: the agent's own.",
    )
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream: bool = True
    auth: AuthInfo = Field(default_factory=AuthInfo)
    session_id: str | None = Field(default=None, max_length=200)
    metadata: dict[str, Any] = Field(default_factory=dict)
    deadline: float | None = Field(default=None, description="Unix time the client stops waiting.")
    created: float = Field(default_factory=time.time)
    tools: list[dict[str, Any]] | None = Field(
        default=None, description="The client's own function tools (OpenAI `tools`): returned to it when called."
    )
    model_settings: ModelSettings | None = Field(
        default=None, description="The client's sampling and format fields for the LLM calls."
    )
    trace: TraceCarrier | None = Field(
        default=None, description="W3C trace context of the sender's span (absent when not traced)."
    )


class HookRef(BaseModel):
    skill: str
    method: str

    @property
    def key(self) -> str:
        return f"{self.skill}.{self.method}"


class ToolInvocation(BaseModel):
    name: str
    arguments: dict[str, Any]


class RouteStep(BaseModel):
    """A segment of the same stage, in another worker group, that the worker answering a
    hop sends the stage on to itself once its own hooks let the stage go on (a route):
    the orchestrator then waits for that hop's reply instead of sending it. The hop's
    deadline is set when it is sent on: `timeout` seconds from then."""

    group: str
    stream: str
    hop_id: str
    hooks: list[HookRef]
    timeout: float = Field(gt=0)


class HopEvent(Envelope):
    """One hop to a worker group: hooks to run in order over `data`, or one tool call.

    Version 2 (hooks): `data` and `ctx` travel in the entry fields `d` and `c` (see the
    module docstring; `hop_parts` returns them), the envelope's `ctx` is `{}`."""

    versions: ClassVar[frozenset[int]] = frozenset({VERSION, SPLIT_VERSION})

    kind: Literal["hop"] = "hop"
    hop_id: str
    completion_id: str
    lifecycle: str
    stage_key: str
    hooks: list[HookRef] = Field(default_factory=list)
    data: dict[str, Any] | None = None
    tool: ToolInvocation | None = None
    ctx: dict[str, Any]
    reply_to: str
    deadline: float
    epoch: int = 0
    trace: TraceCarrier | None = Field(
        default=None, description="W3C trace context of the orchestrator's hop span (absent when not traced)."
    )
    chunks: int = Field(
        default=0, ge=0, description="A batched on_chunk hop: how many chunks `d` holds (0: one stage's data)."
    )
    route: list[RouteStep] | None = Field(
        default=None, description="The stage's next segments, for the worker to send the stage on to (a hook hop only)."
    )
    text: ChunkText | None = Field(
        default=None,
        description="A batched on_chunk hop of protocol 1.1: the stream its chunks come from; the worker keeps the "
        "stream's text so far (absent: the first chunk carries it as its full_content, protocol 1.0).",
    )


class HookTiming(BaseModel):
    hook: str
    duration_ms: float
    outcome: Outcome
    error: str | None = None


class HopReply(Envelope):
    """A worker's answer to one hop, matched to its waiting caller by `hop_id`.

    Version 2 (the answer to a version 2 hop): the hooks' data, when they changed it, is
    the entry field `d` (`data_json`), never `data`."""

    versions: ClassVar[frozenset[int]] = frozenset({VERSION, SPLIT_VERSION})

    kind: Literal["reply"] = "reply"
    hop_id: str
    completion_id: str
    replica: str
    data: dict[str, Any] | None = None
    tool_result: str | None = None
    state: dict[str, Any] = Field(default_factory=dict)
    session: dict[str, Any] = Field(default_factory=dict)
    abort: dict[str, Any] | None = None
    blocked: bool = False
    outcomes: list[HookTiming] = Field(default_factory=list)
    failure: str | None = Field(default=None, description="Why the hop as a whole failed.")
    duration_ms: float = 0.0
    processed: int = Field(
        default=0, ge=0, description="A batched on_chunk hop: the chunks the chain ran over."
    )
    forwarded: str | None = Field(
        default=None, description="The hop id of the route's next hop, when this worker sent the stage on."
    )
    needs_text: bool = Field(
        default=False,
        description="A batched on_chunk hop with `text` whose stream's text so far this replica lacks: no hook ran; "
        "the orchestrator sends the batch again with the first chunk's full_content.",
    )
    data_json: SkipJsonSchema[bytes | None] = Field(default=None, exclude=True, repr=False)
    """The changed HookData as JSON (split format), None when unchanged or version 1: the
    entry field `d`, never part of `e` (`decode` sets it from `d` alone). A plain excluded
    field, not a private attribute: pydantic's private attributes cost more per reply than
    validating all the others (set up on every construction, an exception raised inside
    every read)."""


ResponseKind = Literal["chunk", "progress", "final", "error", "done"]


class ResponseItem(Envelope):
    """One item on `responses:{completion_id}`; `error` and `done` are terminal.

    `progress` items say what the agent is doing between chunks (a server-side tool
    running); they carry no chunk, and the gateway sends them as SSE comment lines."""

    kind: ResponseKind
    completion_id: str
    chunk: dict[str, Any] | None = None
    progress: str | None = None
    completion: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


REQUEST_START = "request_start"
"""The lifecycle of the stage record an orchestrator writes when it starts running a
request, with the request's model and caller: readers show a running request with them."""

LLM_RETRY = "llm_retry"
"""The lifecycle of the stage record of an LLM call whose answer was not taken and which was
asked again: its error starts with the reason (one of LLM_RETRY_REASONS) and a colon."""
LLM_RETRY_REASONS = ("empty_answer",)
"""Why an LLM call is asked again: `empty_answer`, no text and no tool call under
`tool_choice: "auto"` (asked again with "none")."""


class MonitorRecord(Envelope):
    """One line of the `events` firehose: a hop, a stage segment (an LLM call and a tool
    call are stage records too, lifecycle `llm_call` and `tool_call`; so is a request's
    start, lifecycle REQUEST_START), a request's end (kind `request`), or a worker group's
    observers of one lifecycle of a request (`observe`). `ts` is when the step ended; it
    began `duration_ms` before."""

    kind: Literal["hop", "stage", "request", "observe"] = "stage"
    ts: float = Field(default_factory=time.time)
    completion_id: str
    lifecycle: str
    hooks: list[str] = Field(default_factory=list)
    group: str | None = None
    replica: str | None = None
    version: str | None = Field(default=None, description="The version of the group the replica runs (hops).")
    duration_ms: float = 0.0
    outcome: Outcome = Outcome.OK
    error: str | None = None
    model: str | None = Field(
        default=None, description="A request (or request_start) record's model; an llm_call record's too."
    )
    caller: str | None = Field(
        default=None, description="A request (or request_start) record's caller (its peer_user_id)."
    )
    status: int | None = Field(default=None, description="A request record's HTTP status (200, or its error's).")
    agent: str | None = Field(
        default=None, description="A request (or request_start) record's agent, by name."
    )

    @classmethod
    def of_outcomes(
        cls, kind: Literal["stage", "observe"], completion_id: str, lifecycle: str, outcomes: Sequence[HookOutcome],
        duration_ms: float, *, group: str | None, replica: str,
    ) -> MonitorRecord:
        """The record of some hooks' calls (a hook named once, however many calls it had):
        their first failure, if any, is its outcome."""
        bad = next((o for o in outcomes if o.outcome != Outcome.OK), None)
        return cls(
            kind=kind, completion_id=completion_id, lifecycle=lifecycle,
            hooks=list(dict.fromkeys(o.hook for o in outcomes)),  # a hook once, however many calls
            group=group, replica=replica, duration_ms=duration_ms,
            outcome=bad.outcome if bad else Outcome.OK, error=bad.error if bad else None,
        )


class DecodeError(ValueError):
    """An entry that is not a valid envelope of the expected kind; `reason` says why."""


E = TypeVar("E", bound=Envelope)


def encode(envelope: Envelope) -> dict[bytes, bytes]:
    return {FIELD: envelope.model_dump_json(exclude_none=True).encode()}


def encode_hop(event: HopEvent, data_json: bytes, ctx_json: bytes) -> dict[bytes, bytes]:
    """A version 2 hop entry: the small envelope, the data and the context, each dumped once."""
    event.v = SPLIT_VERSION
    event.data = None
    event.ctx = {}
    return {FIELD: event.model_dump_json(exclude_none=True).encode(), CTX_FIELD: ctx_json, DATA_FIELD: data_json}


def hop_parts(event: HopEvent, fields: dict[bytes, bytes]) -> tuple[bytes, bytes | None] | None:
    """(Context JSON, HookData JSON or None) of a version 2 hop; None for version 1."""
    if event.v != SPLIT_VERSION:
        return None
    ctx_json = fields.get(CTX_FIELD)
    if ctx_json is None:
        raise DecodeError(f"version {SPLIT_VERSION} hop without a {CTX_FIELD.decode()!r} field")
    return ctx_json, fields.get(DATA_FIELD)


def encode_reply(reply: HopReply) -> dict[bytes, bytes]:
    """A reply entry; `d` only when it carries changed data in the split format."""
    fields = encode(reply)
    if reply.data_json is not None:
        fields[DATA_FIELD] = reply.data_json
    return fields


def decode(fields: dict[bytes, bytes], model: type[E]) -> E:
    raw = fields.get(FIELD)
    if raw is None:
        raise DecodeError(f"entry has no {FIELD.decode()!r} field (fields: {sorted(k.decode(errors='replace') for k in fields)})")
    try:
        envelope = model.model_validate_json(raw)
    except ValidationError as exc:
        raise DecodeError(f"not a valid {model.__name__}: {_summary(exc)}") from exc
    if envelope.v not in model.versions:
        readable = ", ".join(str(v) for v in sorted(model.versions))
        raise DecodeError(f"unknown envelope version {envelope.v} (this build reads {readable})")
    if isinstance(envelope, HopReply):
        data_json = fields.get(DATA_FIELD) if envelope.v == SPLIT_VERSION else None
        if envelope.data_json is not data_json:  # never what `e` claims: only the `d` field
            envelope.data_json = data_json
    return envelope


def _summary(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors()[:5]
    )


class MonitorBatch(Envelope):
    """One entry of the `events` stream since monitor records are batched: every record
    one writer flushed to one events shard at once, in the order they were emitted. An
    entry holding a bare MonitorRecord (what writers before batching wrote) is still
    read: `monitor_records` decodes both."""

    kind: Literal["batch"] = "batch"
    records: list[MonitorRecord]


def encode_monitor_batch(records: list[MonitorRecord]) -> dict[bytes, bytes]:
    return encode(MonitorBatch.model_construct(records=records))


def monitor_records(fields: dict[bytes, bytes]) -> list[MonitorRecord]:
    """The records of one `events` entry, batched or a single record; DecodeError if neither."""
    try:
        return decode(fields, MonitorBatch).records
    except DecodeError:
        return [decode(fields, MonitorRecord)]


class ResponseBatch(Envelope):
    """One entry of a `responses:{completion_id}` stream since response items are
    batched: every item one journal write stored (hookbus.bus.store.journal), in the order they
    were produced; the terminal item, if any, is the last. An entry holding a bare
    ResponseItem (what writers before batching wrote, and the orchestrator's refusals
    still write) is still read: `response_items` decodes both."""

    kind: Literal["batch"] = "batch"
    items: list[ResponseItem] = Field(min_length=1)


def encode_response_batch(items: list[ResponseItem]) -> bytes:
    """The `e` field of a response batch entry."""
    return encode(ResponseBatch.model_construct(items=items))[FIELD]


def response_items(fields: dict[bytes, bytes]) -> list[ResponseItem]:
    """The items of one response stream entry, batched or a single item, in order;
    DecodeError if neither (the entry is skipped as a whole, as a bad single item was)."""
    try:
        return decode(fields, ResponseBatch).items
    except DecodeError as batch_error:
        try:
            return [decode(fields, ResponseItem)]
        except DecodeError as item_error:
            raise DecodeError(f"{item_error}; as a batch: {batch_error}") from item_error
