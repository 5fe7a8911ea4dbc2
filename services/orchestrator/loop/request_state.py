"""One request's state as it moves through the agent loop (the agent itself holds none)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion

from hookbus.services.orchestrator.loop.observer_handoff import RequestObservations
from hookbus.services.orchestrator.loop.plan import HookPlan
from hookbus.services.orchestrator.loop.run_steps import RunSteps
from hookbus.skills import Context, HookbusError
from hookbus.skills.model_settings import ModelSettings


@dataclass
class RequestState:
    """Everything one run of the loop reads and writes; built by the agent per request."""

    ctx: Context
    plan: HookPlan
    conversation: list[dict[str, Any]]
    stream: bool
    client_tools: list[dict[str, Any]] = field(default_factory=list)
    settings: ModelSettings = field(default_factory=ModelSettings)
    client_calls: list[dict[str, Any]] = field(default_factory=list)
    deadline: float | None = None
    on_progress: Callable[[str], None] | None = None
    usage: CompletionUsage | None = None
    chunks_seen: int = 0
    last_response: ChatCompletion | None = None
    result: ChatCompletion | None = None
    error: HookbusError | None = None
    started: float = field(default_factory=time.perf_counter)
    observations: RequestObservations | None = None
    """Set when any stage has observers for this caller."""
    steps: RunSteps = field(default_factory=RunSteps)
    """The steps a predecessor completed (replayed) and those this run completes (recorded)."""

    @property
    def completion_id(self) -> str:
        return self.ctx.metadata.completion_id
