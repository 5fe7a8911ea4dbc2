"""Where an agent's remote hooks, tools, sessions and monitor records go.

The agent loop is the same in-process and on the bus; only the runtime differs. The
in-process runtime has no remote hooks and keeps sessions in memory; the bus runtime
(hookbus.services.orchestrator.serving.bus_runtime) sends hops to worker groups and keeps sessions in
Redis.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from hookbus.bus.wire.chunk_batch import ChunkIn
from hookbus.services.orchestrator.loop.plan import PlannedHook, PlannedTool, Segment
from hookbus.skills import Context, HookbusError, HookData
from hookbus.skills.lifecycle import Lifecycle
from hookbus.skills.outcome import Outcome
from hookbus.skills.runner import ChainResult, HookOutcome

log = structlog.get_logger("hookbus.runtime")


@dataclass(slots=True)
class ChunkBatchResult:
    """A remote on_chunk segment run over several chunks in one hop: the data of each
    chunk the chain ran over, in order (fewer than sent only when `abort` stopped it at
    the last one; None for a chunk the hooks left as it came), and one outcome per hook
    for the whole batch."""

    data: list[HookData | None]
    outcomes: list[HookOutcome] = field(default_factory=list)
    abort: HookbusError | None = None


class Runtime(Protocol):
    def remote_version(self) -> int:
        """Changes whenever the set of remote hooks or tools changes."""

    def remote_hooks(self) -> Sequence[PlannedHook]: ...

    def remote_tools(self) -> Sequence[PlannedTool]: ...

    async def hop(
        self, segment: Segment, data: HookData, ctx: Context, stage_key: str
    ) -> ChainResult:
        """Run a remote segment in its worker group and bring back the result."""

    def hop_segments(
        self, segments: Sequence[Segment], data: HookData, ctx: Context, stage_key: str
    ) -> AsyncGenerator[ChainResult, None]:
        """Run consecutive remote segments of one stage in turn, each on the data the one
        before left, yielding each one's result; the caller stops iterating (and closes
        the iterator) where the stage stops."""

    async def hop_chunks(self, segment: Segment, chunks: Sequence[ChunkIn], ctx: Context) -> ChunkBatchResult:
        """Run a remote on_chunk segment over `chunks` (in the model's order) in one hop."""

    async def call_tool(self, tool: PlannedTool, arguments: dict[str, Any], ctx: Context) -> str: ...

    async def load_session(self, owner: str | None, session_id: str) -> dict[str, Any]:
        """The session `session_id` of principal `owner` (None: the anonymous caller)."""

    async def save_session(self, owner: str | None, session_id: str, data: dict[str, Any]) -> None: ...

    async def hold_tool_results(self, key: str, record: dict[str, Any]) -> None:
        """Keep a mixed response's server calls and results for the client's next request
        (hookbus.services.orchestrator.loop.client_tools)."""

    async def held_tool_results(self, keys: Sequence[str]) -> list[dict[str, Any] | None]:
        """The records held under `keys` (None where there is none), in order."""

    def record_stage(
        self,
        completion_id: str,
        lifecycle: Lifecycle,
        group: str | None,
        outcomes: Sequence[HookOutcome],
        duration_ms: float,
    ) -> None:
        """A monitor record for one segment of one stage."""

    def record_call(self, completion_id: str, lifecycle: str, name: str, duration_ms: float, error: str | None) -> None:
        """A monitor record for one LLM call (`llm_call`, `name` the model; `llm_retry` for
        one asked again) or one tool call (`tool_call`, `name` the tool; a remote one has its
        hop record too), for the console's waterfall."""


    def send_observations(self, completion_id: str, entries: Sequence[tuple[str, dict[bytes, bytes]]]) -> None:
        """Append a request's observer entries, one per (group, entry), to the groups'
        observer streams (hookbus.bus.wire.observations) without the request waiting."""

    def record_observed(
        self, completion_id: str, lifecycle: Lifecycle, outcomes: Sequence[HookOutcome], duration_ms: float
    ) -> None:
        """A record of what the in-process observers of one stage did (hookbus.services.
        orchestrator.loop.observer_handoff), like `record_stage`'s."""


class LocalRuntime:
    """Everything in this process: no remote hooks, sessions in a dict."""

    def __init__(self) -> None:
        self._sessions: dict[tuple[str | None, str], dict[str, Any]] = {}
        self._held: dict[str, dict[str, Any]] = {}

    def remote_version(self) -> int:
        return 0

    def remote_hooks(self) -> Sequence[PlannedHook]:
        return ()

    def remote_tools(self) -> Sequence[PlannedTool]:
        return ()

    async def hop(
        self, segment: Segment, data: HookData, ctx: Context, stage_key: str
    ) -> ChainResult:
        raise RuntimeError(f"no bus: cannot reach worker group {segment.group!r} in-process")

    async def hop_segments(
        self, segments: Sequence[Segment], data: HookData, ctx: Context, stage_key: str
    ) -> AsyncGenerator[ChainResult, None]:
        raise RuntimeError(f"no bus: cannot reach worker group {segments[0].group!r} in-process")
        yield  # an async generator, as the protocol says

    async def hop_chunks(self, segment: Segment, chunks: Sequence[ChunkIn], ctx: Context) -> ChunkBatchResult:
        raise RuntimeError(f"no bus: cannot reach worker group {segment.group!r} in-process")

    async def call_tool(self, tool: PlannedTool, arguments: dict[str, Any], ctx: Context) -> str:
        raise RuntimeError(f"no bus: cannot reach worker group {tool.group!r} in-process")

    async def load_session(self, owner: str | None, session_id: str) -> dict[str, Any]:
        return copy.deepcopy(self._sessions.get((owner, session_id), {}))

    async def save_session(self, owner: str | None, session_id: str, data: dict[str, Any]) -> None:
        self._sessions[(owner, session_id)] = copy.deepcopy(data)

    async def hold_tool_results(self, key: str, record: dict[str, Any]) -> None:
        self._held[key] = copy.deepcopy(record)

    async def held_tool_results(self, keys: Sequence[str]) -> list[dict[str, Any] | None]:
        return [copy.deepcopy(self._held.get(key)) for key in keys]

    def send_observations(self, completion_id: str, entries: Sequence[tuple[str, dict[bytes, bytes]]]) -> None:
        """No worker groups in-process: there are never entries to send."""

    def record_observed(
        self, completion_id: str, lifecycle: Lifecycle, outcomes: Sequence[HookOutcome], duration_ms: float
    ) -> None:
        self.record_stage(completion_id, lifecycle, None, outcomes, duration_ms)

    def record_call(self, completion_id: str, lifecycle: str, name: str, duration_ms: float, error: str | None) -> None:
        """No events stream in-process: nothing to record."""

    def record_stage(
        self,
        completion_id: str,
        lifecycle: Lifecycle,
        group: str | None,
        outcomes: Sequence[HookOutcome],
        duration_ms: float,
    ) -> None:
        for outcome in outcomes:
            if outcome.outcome != Outcome.OK:
                log.info(
                    "hook_outcome",
                    completion_id=completion_id,
                    lifecycle=lifecycle,
                    hook=outcome.hook,
                    outcome=outcome.outcome,
                    error=outcome.error,
                )
