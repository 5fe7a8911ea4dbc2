"""The request context a hook receives next to its data.

Skills are stateless across requests, so everything a request carries lives here:
`state` travels with the request to every process that runs one of its hooks, and
`session.data` is persisted per conversation in Redis.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class AuthInfo(BaseModel):
    """Who is calling; `scopes` decides which scoped hooks and tools apply."""

    peer_user_id: str | None = None
    scopes: list[str] = Field(default_factory=list)


class Metadata(BaseModel):
    """Facts about the request; extra keys are allowed and travel with it."""

    model_config = ConfigDict(extra="allow")

    completion_id: str = ""
    model: str = ""
    agent_name: str = ""

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


class Session(BaseModel):
    """One conversation's persisted data; `id` is None for a request without a session."""

    id: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class HookCall(BaseModel):
    """Which hook or tool call is running now: lets it make its side effects idempotent.

    In a hook, `idempotency_key` is stable across redeliveries (completion id, stage,
    hook); inside a tool it is the tool call's own (completion id, round, call id:
    `for_tool`), the same when an orchestrator that took the request over from a dead one
    runs a call again that had started and not finished. `attempt` counts a hook's
    deliveries from 1. An observer also learns when its stage ran.
    """

    idempotency_key: str = ""
    attempt: int = 1
    stage_started: float | None = None
    """For an observer (`observe=True`), which runs after the stage: the unix time the
    stage began; None for a hook on the request's path (the time is now)."""
    stage_ended: float | None = None
    """For an observer: the unix time the stage ended (what the next step started from)."""

    @classmethod
    def for_tool(cls, completion_id: str, tool_round: int, call_id: str) -> HookCall:
        """What a tool sees while it runs call `call_id` of the agent's round `tool_round`
        (from 0) in request `completion_id`."""
        return cls(idempotency_key=f"{completion_id}:tool#{tool_round}:{call_id}")


class Context(BaseModel):
    """Everything about the request that is not the stage's data."""

    auth: AuthInfo = Field(default_factory=AuthInfo)
    metadata: Metadata = Field(default_factory=Metadata)
    session: Session = Field(default_factory=Session)
    state: dict[str, Any] = Field(default_factory=dict)
    recovery: bool = Field(
        default=False,
        description=(
            "True when another orchestrator took the request over from one that died: it runs "
            "the rest of the run from its journal, or only finalizes it."
        ),
    )
    call: HookCall = Field(default_factory=HookCall)

    @property
    def completion_id(self) -> str:
        return self.metadata.completion_id

    def allows(self, scope: str) -> bool:
        """Whether a hook or tool with this scope applies to this caller."""
        return scope == "all" or scope in self.auth.scopes
