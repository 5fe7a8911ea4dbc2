"""A replica's observers: it consumes its group's observer stream (`observe:{group}`,
hookbus.bus.wire.observations) and runs the observer hooks of each entry. Nobody waits
for an answer: there is no reply, only the ack.

The stream is its own consumer group `{group}` (its own reader, claims, lease and
janitor, hookbus.bus.groups.member), apart from the hook stream, so a backlog of
observations never delays a hop of the same group's blocking hooks:

- an entry is one request's stages, run in order by one replica (that is what keeps a
  request's observations in order); several entries (requests) run at once, up to
  `concurrency`;
- the reader lingers `LINGER` seconds after a read that delivered entries, so one
  XREADGROUP takes every request that ended meanwhile (no request waits for it: an
  observation only comes later);
- ack after the run: a replica killed mid-entry leaves it pending, a sibling claims it
  once the killed one's heartbeat is `claim_idle` old and runs the whole entry again, so
  delivery is at least once (observers see `ctx.call.attempt` > 1 then); the acks of the
  entries read together go in one XACK once the last of them finished (no entry in
  flight), or `ACK_WAIT` after the first finished when entries keep coming;
- an entry that cannot be decoded, or that was delivered more than `max_deliveries`
  times, goes to the dead-letter stream;
- the janitor trims the stream up to what every group acked (never what is pending).

Each observer's outcomes are recorded on the events stream as `observe` records, one per
lifecycle of an entry (a failing observer: its first error).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Awaitable
from typing import Any

import redis.asyncio as aredis
import structlog

from hookbus.bus.connection.cluster import in_order
from hookbus.bus.connection.retrying import RECONNECT_ERRORS, ensure_group
from hookbus.bus.groups.claims import Claimed, OrphanRules, Steadiness
from hookbus.bus.groups.dead_letters import add_dead_letter
from hookbus.bus.groups.member import GroupMember
from hookbus.bus.groups.shard_reader import ShardedGroupReader
from hookbus.bus.groups.trim import prune_consumers, trim_acked
from hookbus.bus.keys import Keys
from hookbus.bus.store.events import EventWriter
from hookbus.bus.wire.envelopes import DecodeError, MonitorRecord, decode
from hookbus.bus.wire.observations import ObservationBatch
from hookbus.services.worker.host import GroupHost
from hookbus.skills.lifecycle import Lifecycle
from hookbus.skills.observing import ObserverMemory, observe_stage
from hookbus.skills.outcome import Outcome
from hookbus.skills.runner import HookOutcome
from hookbus.skills.skill import BoundHook

log = structlog.get_logger("hookbus.worker.observer")

ACK_WAIT = 0.5
"""Most seconds a finished entry waits for its ack. Acks wait for the last entry in flight
rather than a fixed short delay: on a busy machine the entries of one read finished more
than 50 ms apart, and a fixed 50 ms split their acks (the observers bench's two observer
groups: 0.8 XACKs a request at c=1, for 0.4 reads). Well within a claim's idle time, so a
sibling seldom runs again an entry whose ack was only owed when its replica died."""
LINGER = 1.0
"""Seconds between two reads of the observer stream that deliver: the observations of the
requests that end in that time cost one XREADGROUP, one XACK and one write of their
`observe` records together (nobody waits for them, so only their lag grows with it)."""
READ_BLOCK_MS = 2000
"""An idle replica's blocking read of its observer stream: the longest the connection
allows (hookbus.bus.connection.retrying.connect), so an idle group costs few reads."""

EntryRef = tuple[str, str]


class ObserverConsumer:
    """The observer half of one replica (see the module docstring)."""

    def __init__(
        self,
        host: GroupHost,
        redis_url: str,
        keys: Keys,
        replica: str,
        client: aredis.Redis,
        events: EventWriter | None,
        *,
        concurrency: int,
        claim_idle: float,
        max_deliveries: int,
        trim_every: float,
        steadiness: Steadiness,
    ) -> None:
        """`steadiness`: the replica's own (its heartbeat says whether this process reaches
        Redis steadily enough to claim; the observer half has no heartbeat of its own)."""
        self.host = host
        self.group = host.group
        self.keys = keys
        self.replica = replica
        self.streams = keys.observe_streams(self.group)
        self.concurrency = concurrency
        self.max_deliveries = max_deliveries
        self._redis_url = redis_url
        self._client = client
        self._events = events
        self._in_flight: dict[EntryRef, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._unacked: dict[str, list[str]] = defaultdict(list)
        self._ack_timer: asyncio.TimerHandle | None = None
        self._acking: set[asyncio.Task[None]] = set()
        self._reader: ShardedGroupReader | None = None
        self.member = GroupMember(
            OrphanRules(self.streams[0], self.group, replica, keys.replicas(self.group), claim_idle,
                        count=max(100, concurrency * 4)),
            client=lambda: self._client, concurrency=concurrency, trim_every=trim_every,
            busy=lambda: self._in_flight, renew=self._renew_leases, tidy=self.janitor_once,
            take_over=self._take_over, streams=self.streams,
        )
        self.member.steadiness = steadiness
        self.observed = 0
        """Entries run to their end (each one request's stages)."""
        self.dead_lettered = 0
        self.acks = 0
        """XACK commands sent (each acks every entry finished since the one before)."""

    @staticmethod
    def wanted(host: GroupHost) -> bool:
        """Whether the group hosts any observer (else a replica reads no observer stream)."""
        return any(h.descriptor.observe for h in host.hooks.values())

    @property
    def reads(self) -> int:
        """Reads of the observer stream that brought entries."""
        return self._reader.deliveries if self._reader is not None else 0

    async def start(self) -> None:
        for stream in self.streams:
            await ensure_group(self._client, stream, self.group)
        self.member.start()
        self._reader = ShardedGroupReader(
            self._redis_url, self.streams, self.group, self.replica,
            free=lambda: self.concurrency - len(self._in_flight), deliver=self._deliver, block_ms=READ_BLOCK_MS,
            linger=LINGER,
        )
        self._reader.start()

    async def stop_reading(self) -> None:
        """Read and claim nothing more (a stopping replica: what it has not read stays for its siblings)."""
        reader, self._reader = self._reader, None
        if reader is not None:
            await reader.stop()
        await self.member.stop("claim", "janitor")

    async def stop(self, drain: float) -> None:
        """After `stop_reading`: let running entries finish (up to `drain` s), send the acks owed."""
        busy = self._tasks | self.member.taken
        if busy:
            await asyncio.wait(busy, timeout=drain)
        await self.member.stop()
        with contextlib.suppress(*RECONNECT_ERRORS):  # unacked, a sibling runs them again
            await self._flush_acks()

    # ------------------------------------------------------------ one entry

    def _deliver(self, stream: str, entry_id: str, fields: dict[bytes, bytes]) -> None:
        entry = (stream, entry_id)
        self._in_flight[entry] = time.monotonic()
        task = asyncio.ensure_future(self._run(entry, fields, attempt=1))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _take_over(self, claimed: Claimed) -> Awaitable[None]:
        entry = (claimed.stream, claimed.entry_id)
        self._in_flight[entry] = time.monotonic()
        log.info("observations_claimed", entry_id=claimed.entry_id, attempt=claimed.attempt,
                 previous_owner=claimed.previous_owner, replica=self.replica)
        return self._run(entry, claimed.fields, attempt=claimed.attempt)

    async def _run(self, entry: EntryRef, fields: dict[bytes, bytes], attempt: int) -> None:
        try:
            if attempt > self.max_deliveries:
                await self._dead_letter(entry, fields, f"delivered {attempt} times without being acked")
                return
            try:
                batch = decode(fields, ObservationBatch)
            except DecodeError as exc:
                await self._dead_letter(entry, fields, str(exc))
                return
            await self.observe(batch, attempt)
            self.observed += 1
            self._owe_ack(entry)
        except RECONNECT_ERRORS as exc:  # stays pending: claimed again
            log.warning("observations_failed", entry_id=entry[1], error=str(exc))
        except Exception:  # noqa: BLE001 - stays pending: claimed again, dead-lettered at last
            log.exception("observations_failed", entry_id=entry[1])
        finally:
            self._in_flight.pop(entry, None)
            if self._unacked and not self._in_flight:
                self._ack_soon()
            if self._reader is not None:
                self._reader.wake()

    async def observe(self, batch: ObservationBatch, attempt: int) -> dict[Lifecycle, list[HookOutcome]]:
        """Run each stage's observers in order; the outcomes by lifecycle (also recorded)."""
        memory = ObserverMemory()
        by_lifecycle: dict[Lifecycle, list[HookOutcome]] = defaultdict(list)
        spent: dict[Lifecycle, float] = defaultdict(float)
        ctx = batch.ctx
        # each list of observer keys looked up once: a stream's every chunk has the same
        bound: dict[tuple[str, ...], tuple[list[BoundHook], list[str]]] = {}
        for keys, stage in batch.seen():
            lifecycle = stage.data.lifecycle
            began = time.perf_counter()
            found = bound.get(named := tuple(keys))
            if found is None:
                found = bound[named] = self._hooks_of(named)
            hooks, missing = found
            outcomes = await observe_stage(hooks, stage, ctx, memory, attempt=attempt)
            if missing:
                outcomes += [HookOutcome(k, 0.0, Outcome.FAILED, f"group {self.group!r} has no hook {k!r}")
                             for k in missing]
            by_lifecycle[lifecycle] += outcomes
            spent[lifecycle] += (time.perf_counter() - began) * 1000
        for lifecycle, outcomes in by_lifecycle.items():
            self._record(batch.completion_id, lifecycle, outcomes, spent[lifecycle])
        return by_lifecycle

    def _hooks_of(self, keys: tuple[str, ...]) -> tuple[list[BoundHook], list[str]]:
        """The hooks of `keys` this group hosts, and the keys it does not."""
        hosted = self.host.hooks
        return [hosted[key] for key in keys if key in hosted], [key for key in keys if key not in hosted]

    def _record(self, completion_id: str, lifecycle: str, outcomes: list[HookOutcome], duration_ms: float) -> None:
        if self._events is not None:
            self._events.emit(MonitorRecord.of_outcomes(
                "observe", completion_id, lifecycle, outcomes, duration_ms, group=self.group, replica=self.replica
            ))

    async def _dead_letter(self, entry: EntryRef, fields: dict[bytes, bytes], reason: str) -> None:
        stream, entry_id = entry

        def set_aside(pipe: Any) -> None:
            add_dead_letter(pipe, self.keys.dead_letter, source=stream, entry_id=entry_id, reason=reason,
                            fields=fields, consumer=self.replica)

        await in_order(self._client, set_aside, lambda pipe: pipe.xack(stream, self.group, entry_id))
        self.dead_lettered += 1
        log.warning("dead_lettered", stream=stream, entry_id=entry_id, reason=reason)

    # ---------------------------------------------------------------- acks

    def _owe_ack(self, entry: EntryRef) -> None:
        self._unacked[entry[0]].append(entry[1])
        if self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(ACK_WAIT, self._ack_soon)

    def _ack_soon(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        task = asyncio.ensure_future(self._flush_acks())
        self._acking.add(task)
        task.add_done_callback(self._acking.discard)

    async def _flush_acks(self) -> None:
        acks, self._unacked = self._unacked, defaultdict(list)
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        for stream, ids in acks.items():
            try:
                await self._client.xack(stream, self.group, *ids)
                self.acks += 1
            except RECONNECT_ERRORS as exc:  # still pending: run again once claimed (at least once)
                log.warning("observation_ack_failed", stream=stream, entries=len(ids), error=str(exc))

    # ------------------------------------------------------ background work

    async def _renew_leases(self) -> None:
        by_stream: dict[str, list[str]] = defaultdict(list)
        for stream, entry_id in list(self._in_flight):
            by_stream[stream].append(entry_id)
        for stream, ids in by_stream.items():
            await self._client.xclaim(stream, self.group, self.replica, 0, ids, justid=True)  # type: ignore[arg-type]

    async def janitor_once(self) -> int:
        removed = 0
        for stream in self.streams:
            removed += (await trim_acked(self._client, stream))[0]
            await prune_consumers(self._client, stream, self.group, self.keys.replicas(self.group))
        return removed

