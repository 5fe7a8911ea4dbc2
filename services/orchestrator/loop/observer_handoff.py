"""Handing each stage's end to its observers, off the request's path.

The agent tells a request's `RequestObservations` of every stage that has observers, as
the stage ended (`record`), and closes it once finalize_connection's stage ended
(`close`); nothing here is awaited by the request:

- in-process observers are queued and run by one task per request, in the order the
  stages ended (hookbus.skills.observing says how each is called); `LocalObservers`
  bounds how many stages wait across the agent's requests: past `max_waiting`, a stage is
  dropped for its in-process observers (logged, counted in `dropped`), never waited for;
- a worker group's observers get the request's stages in one entry when the request is
  over (hookbus.bus.wire.observations: why one entry), which the runtime appends without
  waiting (`Runtime.send_observations`). A request that passes `MAX_STAGES` observed
  stages keeps the first ones and finalize_connection's (the rest are counted and logged).

A stage that aborted the run (a HookError) is not observed; finalize_connection is, on
every path, with `data.error` set when the run failed.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog
from pydantic_core import to_json

from hookbus.bus.wire.chunk_batch import ChunkIn
from hookbus.bus.wire.observations import BatchWriter
from hookbus.services.orchestrator.loop.plan import PlannedHook
from hookbus.skills import Context, HookData
from hookbus.skills.context import HookCall, Session
from hookbus.skills.lifecycle import Lifecycle
from hookbus.skills.observing import ObserverMemory, StageSeen, observe_stage
from hookbus.skills.runner import HookOutcome, copy_state
from hookbus.skills.skill import BoundHook

log = structlog.get_logger("hookbus.observations")

MAX_STAGES = 20_000
"""Observed stages one request sends a group at most (a long stream's chunks)."""
MAX_WAITING = 10_000
"""Stages waiting for in-process observers, over all of an agent's requests."""


class ObservationSink(Protocol):
    """Where a request's observations go (the agent's runtime): the groups' entries, and
    the outcomes of its in-process observers."""

    def send_observations(self, completion_id: str, entries: Sequence[tuple[str, dict[bytes, bytes]]]) -> None:
        """Append each (group, entry) to that group's observer stream, without waiting."""

    def record_observed(
        self, completion_id: str, lifecycle: Lifecycle, outcomes: Sequence[HookOutcome], duration_ms: float
    ) -> None:
        """Record what the in-process observers of one stage did."""


@dataclass(slots=True)
class _Queued:
    """A request's stages waiting for its in-process observers, and the task running them."""

    ctx: Context
    sink: ObservationSink
    memory: ObserverMemory = field(default_factory=ObserverMemory)
    waiting: collections.deque[tuple[list[BoundHook], StageSeen]] = field(default_factory=collections.deque)
    task: asyncio.Task[None] | None = None


class LocalObservers:
    """Runs the in-process observers of an agent's requests, one task per request."""

    def __init__(self, max_waiting: int = MAX_WAITING) -> None:
        self.max_waiting = max_waiting
        self.waiting = 0
        self.dropped = 0
        self.called = 0
        """Observer calls made (each observer of each stage)."""
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, queued: _Queued, hooks: list[BoundHook], stage: StageSeen) -> None:
        if self.waiting >= self.max_waiting:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("observations_dropped", completion_id=queued.ctx.completion_id, dropped=self.dropped,
                            waiting=self.waiting, hint="in-process observers are slower than the requests")
            return
        queued.waiting.append((hooks, stage))
        self.waiting += 1
        if queued.task is None or queued.task.done():
            queued.task = asyncio.ensure_future(self._run(queued))
            self._tasks.add(queued.task)
            queued.task.add_done_callback(self._tasks.discard)

    async def _run(self, queued: _Queued) -> None:
        while queued.waiting:
            hooks, stage = queued.waiting.popleft()
            try:
                began = time.perf_counter()
                outcomes = await observe_stage(hooks, stage, queued.ctx, queued.memory)
                self.called += len(hooks)
                queued.sink.record_observed(
                    queued.ctx.completion_id, stage.data.lifecycle, outcomes, (time.perf_counter() - began) * 1000
                )
            except Exception:  # noqa: BLE001 - observe_stage never raises for a hook; this is a bug
                log.exception("observers_failed", completion_id=queued.ctx.completion_id)
            finally:
                self.waiting -= 1

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until no in-process observation is waiting or running; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._tasks:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            await asyncio.wait(set(self._tasks), timeout=left)
        return True


@dataclass(frozen=True, slots=True)
class _Route:
    """Where the observers of a stage are, worked out once per observer list (the plan
    gives every stage of a lifecycle the same tuple, and a stream's every chunk is a
    stage): the in-process hooks, and each worker group's observer keys."""

    observers: Sequence[PlannedHook]
    local: list[BoundHook]
    groups: tuple[tuple[str, list[str]], ...]

    @classmethod
    def of(cls, observers: Sequence[PlannedHook]) -> _Route:
        by_group: dict[str, list[str]] = {}
        for planned in observers:
            if planned.group is not None:
                by_group.setdefault(planned.group, []).append(planned.key)
        local = [h.local for h in observers if h.local is not None]
        return cls(observers, local, tuple(by_group.items()))


class RequestObservations:
    """One request's observations (see the module docstring)."""

    def __init__(self, ctx: Context, local: LocalObservers, sink: ObservationSink) -> None:
        self._ctx = ctx
        self._local = local
        self._sink = sink
        self._queued: _Queued | None = None
        self._groups: dict[str, BatchWriter] = {}
        self._routes: dict[int, _Route] = {}
        self._most = 0
        """Stages of the group that has the most."""
        self._skipped = 0
        self._closed = False

    def record(
        self, observers: Sequence[PlannedHook], data: HookData | ChunkIn, stage_key: str, started: float
    ) -> None:
        """A stage ended with `data`, which `observers` (the stage's, non-empty) watch; an
        on_chunk stage no hook changed may come as the chunk as it came (its HookData is
        then built only for in-process observers: a stream's every chunk comes here).
        Never raises: a stage that cannot be copied or dumped (a value that is not JSON in
        `ctx.state`) is logged and left unobserved, the request goes on."""
        if self._closed:
            return
        try:
            self._record(observers, data, stage_key, started)
        except Exception:  # noqa: BLE001 - an observer never fails a request
            log.exception("observation_not_recorded", completion_id=self._ctx.completion_id, stage=stage_key)

    def _record(
        self, observers: Sequence[PlannedHook], data: HookData | ChunkIn, stage_key: str, started: float
    ) -> None:
        ended = time.time()
        ctx = self._ctx
        route = self._route(observers)
        if route.local:
            seen = data.data() if isinstance(data, ChunkIn) else data
            stage = StageSeen(seen.model_copy(deep=True), copy_state(ctx.state), stage_key, started, ended)
            self._local.submit(self._local_queue(), route.local, stage)
        if not route.groups:
            return
        if self._most >= MAX_STAGES and (isinstance(data, ChunkIn) or data.lifecycle != "finalize_connection"):
            self._skip()
            return
        state_json = to_json(ctx.state)
        for group, keys in route.groups:
            writer = self._groups.get(group)
            if writer is None:
                writer = self._groups[group] = BatchWriter(group)
            if isinstance(data, ChunkIn):
                writer.add_chunk(data, keys, stage_key, started, ended, state_json)
            else:
                writer.add(data, keys, stage_key, started, ended, state_json)
            self._most = max(self._most, len(writer))

    def close(self) -> None:
        """The request is over: its groups' entries go to the runtime, once."""
        if self._closed:
            return
        self._closed = True
        if not self._groups:
            return
        ctx_json = self._ctx.model_dump_json(exclude={"state"}).encode()
        cid = self._ctx.completion_id
        self._sink.send_observations(cid, [(group, w.fields(cid, ctx_json)) for group, w in self._groups.items()])

    def _local_queue(self) -> _Queued:
        if self._queued is None:
            ctx = self._ctx
            session = Session.model_construct(id=ctx.session.id, data=ctx.session.data)
            observer_ctx = Context.model_construct(
                auth=ctx.auth, metadata=ctx.metadata, session=session, state={}, recovery=ctx.recovery,
                call=HookCall(),
            )
            self._queued = _Queued(observer_ctx, self._sink)
        self._queued.ctx.recovery = self._ctx.recovery
        return self._queued

    def _route(self, observers: Sequence[PlannedHook]) -> _Route:
        route = self._routes.get(id(observers))
        if route is None or route.observers is not observers:  # held by its route: an id is not reused
            route = self._routes[id(observers)] = _Route.of(observers)
        return route

    def _skip(self) -> None:
        self._skipped += 1
        if self._skipped == 1:
            log.warning("observations_capped", completion_id=self._ctx.completion_id, kept=MAX_STAGES)
