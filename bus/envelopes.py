"""Versioned envelopes: every entry on every hookbus stream is one of these models.

An entry carries a single field `e` holding the envelope's JSON. A consumer that cannot
decode an entry (not JSON, wrong shape, unknown version) moves it to the dead-letter
stream with the reason and goes on (bus.deadletter).
"""

from __future__ import annotations

import time
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from skills.context import AuthInfo

VERSION = 1
FIELD = b"e"


class Envelope(BaseModel):
    model_config = ConfigDict(extra="ignore")

    v: int = VERSION


class RequestEnvelope(Envelope):
    """A client's request on `requests`; the client picks the completion id."""

    kind: Literal["request"] = "request"
    completion_id: str = Field(min_length=1, max_length=200)
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream: bool = True
    auth: AuthInfo = Field(default_factory=AuthInfo)
    session_id: str | None = Field(default=None, max_length=200)
    metadata: dict[str, Any] = Field(default_factory=dict)
    deadline: float | None = Field(default=None, description="Unix time the client stops waiting.")
    created: float = Field(default_factory=time.time)


class HookRef(BaseModel):
    skill: str
    method: str

    @property
    def key(self) -> str:
        return f"{self.skill}.{self.method}"


class ToolInvocation(BaseModel):
    name: str
    arguments: dict[str, Any]


COMPACTION_LIFECYCLE = "on_compaction"
"""A hop of this lifecycle carries a compaction outcome as `data`; `hooks` names the
skills whose `on_compaction` to call (method "on_compaction"); `ctx` is `{}` for a
compaction between turns (the skills then get ctx=None)."""


class HopEvent(Envelope):
    """One hop to a worker group: hooks to run in order over `data`, or one tool call,
    or (lifecycle `on_compaction`) a compaction outcome for the group's skills."""

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


class HookTiming(BaseModel):
    hook: str
    duration_ms: float
    outcome: str
    error: str | None = None


class HopReply(Envelope):
    """A worker's answer to one hop, matched to its waiting caller by `hop_id`."""

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


ResponseKind = Literal["chunk", "final", "error", "done"]


class ResponseItem(Envelope):
    """One item on `responses:{completion_id}`; `error` and `done` are terminal."""

    kind: ResponseKind
    completion_id: str
    chunk: dict[str, Any] | None = None
    completion: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class MonitorRecord(Envelope):
    """One line of the `events` firehose: a hop, a stage segment, or a request's start or end."""

    kind: Literal["hop", "stage", "request"] = "stage"
    ts: float = Field(default_factory=time.time)
    completion_id: str
    lifecycle: str
    hooks: list[str] = Field(default_factory=list)
    group: str | None = None
    replica: str | None = None
    duration_ms: float = 0.0
    outcome: str = "ok"
    error: str | None = None


class DecodeError(ValueError):
    """An entry that is not a valid envelope of the expected kind; `reason` says why."""


E = TypeVar("E", bound=Envelope)


def encode(envelope: Envelope) -> dict[bytes, bytes]:
    return {FIELD: envelope.model_dump_json(exclude_none=True).encode()}


def decode(fields: dict[bytes, bytes], model: type[E]) -> E:
    raw = fields.get(FIELD)
    if raw is None:
        raise DecodeError(f"entry has no {FIELD.decode()!r} field (fields: {sorted(k.decode(errors='replace') for k in fields)})")
    try:
        envelope = model.model_validate_json(raw)
    except ValidationError as exc:
        raise DecodeError(f"not a valid {model.__name__}: {_summary(exc)}") from exc
    if envelope.v != VERSION:
        raise DecodeError(f"unknown envelope version {envelope.v} (this build reads {VERSION})")
    return envelope


def _summary(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors()[:5]
    )
