"""What the loop's stages read of the agent that runs them.

The stages live in modules of their own (the lifecycle walk, the LLM round, the tool
round, finalize); they take the agent as a `LoopHost`, so they see its parts, never its
per-request state (there is none: a run's state is its `RequestState`).
"""

from __future__ import annotations

from typing import Protocol

from hookbus.services.orchestrator.compaction.compactor import Compactor
from hookbus.services.orchestrator.llm.client import LLM
from hookbus.services.orchestrator.loop.observer_handoff import LocalObservers
from hookbus.services.orchestrator.loop.plan import HookPlan
from hookbus.services.orchestrator.loop.runtime import Runtime
from hookbus.skills.model_settings import ModelSettings


class LoopHost(Protocol):
    """An agent, as its loop sees it (`Agent` is the one there is)."""

    name: str
    model: str
    llm: LLM
    instructions: str | None
    model_settings: ModelSettings
    pinned_settings: ModelSettings
    max_tool_rounds: int
    compactor: Compactor
    local_observers: LocalObservers

    @property
    def runtime(self) -> Runtime: ...

    @property
    def chunk_batch(self) -> int: ...

    def plan(self) -> HookPlan: ...
