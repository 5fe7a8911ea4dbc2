"""What the console shows, read from Redis by one poller per process for all its viewers.

The poller runs only while someone watches (a viewer asked within IDLE_AFTER seconds) and
reads every POLL_EVERY seconds: the bus state of `hookbus status`
(hookbus.services.cli.monitor.read_bus_state: registry, heartbeats, consumer groups, the
dead-letter count) and the `events` records written since its last read (one XRANGE per
events shard, at most EVENTS_PAGE entries each). The first poll backfills the newest
BACKFILL_RECORDS records. The dead-letter list is re-read only when the count moved.
Requests, their rates and waterfalls are computed from the records kept in memory (the
last KEPT_REQUESTS requests), so the console's cost does not grow with its viewers or
with the bus's request rate.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any

import redis.asyncio as aredis
import structlog
from pydantic import BaseModel, Field

from hookbus.bus.connection.retrying import RECONNECT_ERRORS
from hookbus.bus.connection.values import text
from hookbus.bus.groups.periodic import cancel_and_wait
from hookbus.bus.keys import Keys
from hookbus.bus.wire.envelopes import REQUEST_START, MonitorRecord
from hookbus.services.cli.monitor import BusState, decoded_records, read_bus_state, recent_events
from hookbus.services.console.dead_letters import DeadLetterView, list_dead_letters
from hookbus.services.gateway.sse import sse_event

log = structlog.get_logger("hookbus.console")

POLL_EVERY = 2.0
"""Seconds between two reads of Redis (what the page shows lags by as much)."""
IDLE_AFTER = 30.0
"""The poller stops when no viewer asked for this long: an unwatched console costs nothing."""
EVENTS_PAGE = 1_000
BACKFILL_RECORDS = 5_000
KEPT_REQUESTS = 2_000
LIVE_REQUESTS = 200
"""The newest requests each live frame carries (filters search all KEPT_REQUESTS)."""
RECORDS_PER_REQUEST = 2_000
"""A request's records kept at most (a long stream of on_chunk hops keeps its first ones)."""
RATE_WINDOW = 60.0
BEHIND_LAG = 100
"""A group with at least this many entries not yet delivered stands out as falling behind."""


class ReplicaView(BaseModel):
    name: str
    version: str | None = Field(default=None, description="The version the replica runs, when it announces one.")
    heartbeat_age: float = Field(description="Seconds since its last heartbeat.")
    up_for: float | None = Field(
        default=None,
        description="Seconds since the replica started, as it says (None: a worker that does not say when).",
    )
    seen_for: float = Field(description="Seconds this console has seen it alive (its age, at least).")
    in_flight: int


class GroupView(BaseModel):
    name: str
    hooks: list[str]
    tools: list[str]
    replicas: list[ReplicaView]
    lag: int
    pending: int
    live: bool
    behind: bool
    observe_lag: int = Field(default=0, description="Observation entries not yet delivered to its observers.")
    observe_dropped: int = Field(
        default=0, description="Observation entries its backlog bound dropped since the count began."
    )
    observe_dropped_bytes: int = 0


class OrchestratorView(BaseModel):
    name: str
    heartbeat_age: float


class AgentView(BaseModel):
    """One agent served by name: its orchestrators, its own queue, its last minute."""

    name: str
    orchestrators: list[str]
    lag: int
    pending: int
    requests_per_second: float
    errors_last_minute: int


class BusView(BaseModel):
    at: float
    groups: list[GroupView]
    orchestrators: list[OrchestratorView]
    agents: list[AgentView] = Field(default_factory=list, description="Every agent known, by name.")
    requests_lag: int
    requests_pending: int
    requests_per_second: float
    finished_last_minute: int
    errors_by_status: dict[str, int] = Field(description="Requests that ended in the last minute, per HTTP status.")
    dead_letters: int


class RequestView(BaseModel):
    completion_id: str
    model: str | None = Field(default=None, description="Known from its start (its request_start record).")
    agent: str | None = Field(default=None, description="Known from its start (its request_start record).")
    caller: str | None = Field(default=None, description="Known from its start (its request_start record).")
    status: int | None = Field(default=None, description="HTTP status; None while it runs.")
    outcome: str = Field(description="`running` while it runs, else the request record's outcome.")
    started: float
    duration_ms: float
    groups: list[str]
    error: str | None = None


class StepView(BaseModel):
    """One bar of the waterfall: a stage segment, a hop, an LLM call or a tool call."""

    kind: str
    lifecycle: str
    group: str | None
    replica: str | None
    hooks: list[str]
    start: float
    duration_ms: float
    outcome: str
    error: str | None


class Waterfall(BaseModel):
    request: RequestView
    steps: list[StepView]


class Snapshot(BaseModel):
    """What every viewer's live stream gets after each poll."""

    bus: BusView
    requests: list[RequestView]
    dead_letters: list[DeadLetterView]


class RequestTrack:
    """The records of one request, as they arrive."""

    def __init__(self, completion_id: str) -> None:
        self.completion_id = completion_id
        self.records: list[MonitorRecord] = []
        self.begun: MonitorRecord | None = None
        self.ended: MonitorRecord | None = None
        self._ended_view: RequestView | None = None
        """An ended request's view, kept until another record of it arrives: each poll
        lists every kept request, and building thousands of views held the loop."""

    def add(self, record: MonitorRecord) -> None:
        self._ended_view = None
        if record.kind == "request":
            self.ended = record
        elif record.lifecycle == REQUEST_START:  # its model and caller while it runs; not a step
            self.begun = record
        elif len(self.records) < RECORDS_PER_REQUEST:
            self.records.append(record)

    def view(self, now: float) -> RequestView:
        if self.ended is None:
            return self._view(now)
        if self._ended_view is None:
            self._ended_view = self._view(now)
        return self._ended_view

    def _view(self, now: float) -> RequestView:
        starts = [_start(r) for r in (*self.records, self.begun, self.ended) if r is not None]
        started = min(starts)
        groups = sorted({r.group for r in self.records if r.group})
        ended = self.ended
        if ended is None:
            begun = self.begun
            return RequestView(
                completion_id=self.completion_id, model=begun.model if begun else None,
                agent=begun.agent if begun else None, caller=begun.caller if begun else None,
                outcome="running", started=started, duration_ms=(now - started) * 1000, groups=groups,
            )
        return RequestView(
            completion_id=self.completion_id, model=ended.model, agent=ended.agent, caller=ended.caller,
            status=ended.status, outcome=str(ended.outcome), started=started,
            duration_ms=ended.duration_ms, groups=groups, error=ended.error,
        )

    def waterfall(self, now: float) -> Waterfall:
        steps = [
            StepView(
                kind=r.kind, lifecycle=r.lifecycle, group=r.group, replica=r.replica, hooks=r.hooks,
                start=_start(r), duration_ms=r.duration_ms, outcome=str(r.outcome), error=r.error,
            )
            for r in sorted(self.records, key=_start)
        ]
        return Waterfall(request=self.view(now), steps=steps)


def _matches(
    view: RequestView, outcome: str | None, group: str | None, caller: str | None, agent: str | None = None
) -> bool:
    if outcome == "error" and view.outcome in ("ok", "running"):
        return False
    if outcome not in (None, "", "error") and outcome not in (view.outcome, str(view.status)):
        return False
    if group and group not in view.groups:
        return False
    if agent and view.agent != agent:
        return False
    return not caller or view.caller == caller


def _start(record: MonitorRecord) -> float:
    """Records carry when they ended (`ts`) and how long they took."""
    return record.ts - record.duration_ms / 1000


class ConsoleData:
    """The shared, periodically refreshed view of one bus (one per process)."""

    def __init__(self, client: aredis.Redis, keys: Keys, *, idle_after: float = IDLE_AFTER) -> None:
        self._client = client
        self._keys = keys
        self._idle_after = idle_after
        self._requests: OrderedDict[str, RequestTrack] = OrderedDict()
        self._positions: dict[str, str] | None = None
        self._first_seen: dict[str, float] = {}
        self._dead_letters: list[DeadLetterView] = []
        self._dead_letter_count = -1
        self._snapshot: Snapshot | None = None
        self._frame: tuple[Snapshot, bytes] | None = None
        self._fresh = asyncio.Condition()
        self._reading = asyncio.Lock()  # a poll and an action's refresh never read the same events twice
        self._wanted_at = 0.0
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ viewers

    async def snapshot(self) -> Snapshot:
        """The latest snapshot; the first call of an idle console waits for a fresh poll."""
        self._wanted_at = time.monotonic()
        if self._task is None or self._task.done():
            self._snapshot = None  # what an idle console read last is stale: wait for a fresh poll
            self._task = asyncio.create_task(self._poll_while_watched(), name="hookbus-console")
        async with self._fresh:
            await self._fresh.wait_for(lambda: self._snapshot is not None)
        assert self._snapshot is not None
        return self._snapshot

    async def next_snapshot(self, after: Snapshot) -> Snapshot:
        """The first snapshot newer than `after` (a live stream's next frame)."""
        self._wanted_at = time.monotonic()
        async with self._fresh:
            await self._fresh.wait_for(lambda: self._snapshot is not after)
        assert self._snapshot is not None
        return self._snapshot

    def live_frame(self, snapshot: Snapshot) -> bytes:
        """`snapshot` as a live stream's event, encoded once for all viewers."""
        if self._frame is None or self._frame[0] is not snapshot:
            self._frame = (snapshot, sse_event(snapshot.model_dump(mode="json"), "snapshot"))
        return self._frame[1]

    def waterfall(self, completion_id: str) -> Waterfall | None:
        track = self._requests.get(completion_id)
        return None if track is None else track.waterfall(time.time())

    async def refresh_now(self) -> None:
        """Poll at once (after an action the viewer wants to see the effect of)."""
        self._dead_letter_count = -1
        await self._poll_once()

    @property
    def polling(self) -> bool:
        """Whether the poller runs (someone watched within `idle_after` seconds)."""
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    # ------------------------------------------------------------------ polling

    async def _poll_while_watched(self) -> None:
        while time.monotonic() - self._wanted_at < self._idle_after:
            try:
                await self._poll_once()
            except RECONNECT_ERRORS as exc:
                log.warning("console_read_failed", error=str(exc) or type(exc).__name__)
            await asyncio.sleep(POLL_EVERY)
        log.info("console_idle", idle_for=self._idle_after)

    async def _poll_once(self) -> None:
        async with self._reading:
            state = await read_bus_state(self._client, self._keys)
            await self._read_events()
            if state.dead_letters != self._dead_letter_count:
                self._dead_letters = await list_dead_letters(self._client, self._keys)
                self._dead_letter_count = state.dead_letters
        snapshot = Snapshot(
            bus=self._bus_view(state, time.time()),
            requests=self.requests()[:LIVE_REQUESTS],
            dead_letters=self._dead_letters,
        )
        async with self._fresh:
            self._snapshot = snapshot
            self._fresh.notify_all()

    async def _read_events(self) -> None:
        if self._positions is None:
            for record in await recent_events(self._client, self._keys, BACKFILL_RECORDS):
                self._keep(record)
            async with self._client.pipeline(transaction=False) as pipe:
                for stream in self._keys.event_streams:
                    pipe.xrevrange(stream, count=1)
                newest = await pipe.execute()
            self._positions = {
                stream: text(entries[0][0]) if entries else "0-0"
                for stream, entries in zip(self._keys.event_streams, newest, strict=True)
            }
            return
        async with self._client.pipeline(transaction=False) as pipe:
            for stream, last in self._positions.items():
                pipe.xrange(stream, min=f"({last}", max="+", count=EVENTS_PAGE)
            pages: list[Any] = await pipe.execute()
        records: list[MonitorRecord] = []
        for stream, entries in zip(list(self._positions), pages, strict=True):
            if entries:
                self._positions[stream] = text(entries[-1][0])
                records += decoded_records(entries)
        for record in sorted(records, key=lambda r: r.ts):
            self._keep(record)

    def _keep(self, record: MonitorRecord) -> None:
        track = self._requests.get(record.completion_id)
        if track is None:
            track = self._requests[record.completion_id] = RequestTrack(record.completion_id)
            if len(self._requests) > KEPT_REQUESTS:
                self._requests.popitem(last=False)
        track.add(record)

    # ------------------------------------------------------------------ views

    def requests(
        self, *, outcome: str | None = None, group: str | None = None, caller: str | None = None,
        agent: str | None = None,
    ) -> list[RequestView]:
        """The kept requests, newest first; `outcome` is `running`, `ok`, `failed`... or
        `error` (any but ok and running), or an HTTP status."""
        now = time.time()
        views = sorted((t.view(now) for t in self._requests.values()), key=lambda v: v.started, reverse=True)
        return [v for v in views if _matches(v, outcome, group, caller, agent)]

    def _bus_view(self, state: BusState, now: float) -> BusView:
        ended = [
            t.ended for t in self._requests.values() if t.ended is not None and now - t.ended.ts <= RATE_WINDOW
        ]
        errors: dict[str, int] = {}
        for record in ended:
            if record.outcome != "ok":
                key = str(record.status or "error")
                errors[key] = errors.get(key, 0) + 1
        alive = {name for group in state.groups for name in group.heartbeats}
        self._first_seen = {name: seen for name, seen in self._first_seen.items() if name in alive}
        groups = []
        for group in state.groups:
            version_of = {replica: v.version for v in group.versions for replica in v.replicas}
            started = {replica: at for v in group.versions for replica, at in v.started.items()}
            replicas = [
                ReplicaView(
                    name=name, version=version_of.get(name), heartbeat_age=max(0.0, now - beat),
                    up_for=max(0.0, now - started[name]) if name in started else None,
                    seen_for=now - self._seen(name, beat), in_flight=group.in_flight.get(name, 0),
                )
                for name, beat in sorted(group.heartbeats.items())
            ]
            groups.append(
                GroupView(
                    name=group.name, hooks=group.hooks, tools=group.tools, replicas=replicas,
                    lag=group.lag, pending=group.pending, live=bool(replicas), behind=group.lag >= BEHIND_LAG,
                    observe_lag=group.observe_lag, observe_dropped=group.observe_dropped,
                    observe_dropped_bytes=group.observe_dropped_bytes,
                )
            )
        return BusView(
            at=now,
            groups=groups,
            orchestrators=[
                OrchestratorView(name=name, heartbeat_age=max(0.0, now - beat))
                for name, beat in sorted(state.orchestrators.items())
            ],
            agents=[
                AgentView(
                    name=agent.name, orchestrators=agent.orchestrators, lag=agent.lag, pending=agent.pending,
                    requests_per_second=round(sum(1 for r in ended if r.agent == agent.name) / RATE_WINDOW, 2),
                    errors_last_minute=sum(1 for r in ended if r.agent == agent.name and r.outcome != "ok"),
                )
                for agent in state.agents
            ],
            requests_lag=state.requests_lag,
            requests_pending=state.requests_pending,
            requests_per_second=round(len(ended) / RATE_WINDOW, 2),
            finished_last_minute=len(ended),
            errors_by_status=errors,
            dead_letters=state.dead_letters,
        )

    def _seen(self, replica: str, beat: float) -> float:
        return self._first_seen.setdefault(replica, beat)
