"""One replica of a hook-worker group: a FastStream app on `hooks:{group}`.

- consumer group `{group}`, consumer name unique per replica (host + pid);
- the hop path is a plain XREADGROUP loop (not FastStream's per-message dispatch, which
  cost ~3x the CPU per hop: tests/bench/RESULTS.md): it reads as many entries as there
  are free slots, so `--concurrency N` bounds prefetch + in flight exactly (a second
  replica really takes work instead of one replica swallowing the backlog), one task per
  entry; a Redis error makes it reconnect with backoff. FastStream still runs the app's
  lifecycle (signals, startup/shutdown hooks) and documents the stream (AsyncAPI);
- reply first, then ack: the replies finished in one event-loop turn go out in one
  pipelined round trip; the entries they answer are acked with the next such pipeline or
  within ACK_DELAY on their own (ReplyBatcher), so a hop costs one round trip; a failed
  batch falls back to a per-hop reply + ack retried through a short Redis outage while
  the hop's deadline allows;
- entries left pending by a dead sibling (no heartbeat for `claim_idle` seconds) are
  claimed once idle `claim_idle` seconds (bus/claims.py); hooks see the real delivery
  number as `ctx.call.attempt`; long hooks renew their claim every `claim_idle / 3`
  seconds so nobody takes them while they are alive; an entry delivered more than
  `max_deliveries` times goes to the dead-letter stream and its caller is told the hop
  failed;
- a janitor trims the group's stream up to what was acked and forgets siblings gone for
  long (bus/trim.py);
- it runs its group at a version (hookbus.services.worker.versioning) and reads, beside
  `hooks:{group}`, the stream of its version `hooks:{group}@{version}`, where requests
  pinned to that version send their hops (hookbus.bus.groups.versions);
- on SIGTERM the replica drains (hookbus.services.worker.drain): marked draining, it stops
  reading at once if a sibling of its version serves on, else once no request pinned to
  its version is left; then it stops claiming and leaves the registry, in-flight hops
  finish (up to `DRAIN_SECONDS`) with their leases renewed, their acks are sent, and its
  consumer is deleted (nothing left for a lease to expire); what it had not read stays in
  the stream for its siblings.

Hooks run in this process's event loop: a long hook must be `async` (or have a
`timeout`, which runs a sync hook in a thread); a sync hook that blocks the loop stops the
heartbeat and the lease renewal too, and its hop is then claimed by a sibling.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from typing import Any

import pydantic_core
import redis.asyncio as aredis
import structlog
from faststream.middlewares import AckPolicy
from faststream.redis import RedisStreamMessage, StreamSub
from redis.exceptions import ResponseError

from hookbus.bus.connection.batched_appends import settle
from hookbus.bus.connection.cluster import in_order, keys_for
from hookbus.bus.connection.pipeline import Commands, execute
from hookbus.bus.connection.retrying import (
    RECONNECT_ERRORS,
    ensure_group,
    instance_name,
    out_of_memory,
    raw_entry_parser,
    retryable,
)
from hookbus.bus.connection.values import text
from hookbus.bus.groups.claims import (
    Claimed,
    OrphanRules,
)
from hookbus.bus.groups.dead_letters import add_dead_letter
from hookbus.bus.groups.member import GroupMember
from hookbus.bus.groups.registry import announce, heartbeat, leave
from hookbus.bus.groups.shard_reader import ShardedGroupReader
from hookbus.bus.groups.trim import TRIM_EVERY, delete_consumer_if_idle, prune_consumers, trim_acked
from hookbus.bus.groups.versions import ReplicaInfo, parse_infos, publish
from hookbus.bus.hops.pipelined_read import RideOffer, RideSlot
from hookbus.bus.hops.send_on import Onward, send_on
from hookbus.bus.limits import over_hop_limits
from hookbus.bus.settings import get_settings
from hookbus.bus.store.events import EventWriter
from hookbus.bus.wire.envelopes import (
    DecodeError,
    HopEvent,
    HopReply,
    MonitorRecord,
    decode,
    encode,
    encode_reply,
    hop_parts,
)
from hookbus.services.observability import tracing
from hookbus.services.process.bus_app import BusApp
from hookbus.services.process.defaults import (
    WORKER_CLAIM_IDLE,
    WORKER_CONCURRENCY,
    WORKER_MAX_DELIVERIES,
)
from hookbus.services.worker.drain import serve_pinned_requests
from hookbus.services.worker.host import GroupHost
from hookbus.services.worker.observer import ObserverConsumer
from hookbus.services.worker.versioning import hooks_fingerprint, replica_version
from hookbus.skills.outcome import Outcome

log = structlog.get_logger("hookbus.worker")

DRAIN_SECONDS = 30.0
REPLY_RETRY_GRACE = 5.0
_REPLY_ERRORS = (*RECONNECT_ERRORS, ResponseError)
"""What sending a reply may fail with: those worth a retry are sorted out by `retryable`."""
READ_BLOCK_MS = 1000
ACK_DELAY = 0.1
"""How long an answered hop waits at most for its ack, which then goes alone, with the acks
of all the hops answered meanwhile in one XACK."""
ACK_RIDE_AFTER = 0.01
"""From this many seconds on, the acks owed ride with the next pipeline of replies instead
of waiting for ACK_DELAY to send them alone: hops up to ACK_DELAY apart (one request at a
time) pay no socket write of their own for their acks, while under load the acks still
go in one XACK per ACK_RIDE_AFTER at most. Before (every ack alone after 20 ms, riding
only with the replies flushed at that moment), one request at a time through a worker
group's hook cost the worker 0.5-0.75 socket writes a hop for acks, a third or more of
its writes (the gateways bench, `strace -c` of the replica)."""

EntryRef = tuple[str, str]
"""(the shard stream an entry was read from, its entry id): ids repeat across shards."""


class ReplyBatcher:
    """Replies ready in one event-loop turn go out at once in one pipeline; the entries
    they answer are acked later, all those answered within `ack_delay` seconds of the
    oldest together (one XACK per stream, riding with the replies of that moment when
    there are some, or with the first replies sent once the oldest waited
    `ack_ride_after`): a steady flow of hops costs one command per hop, not a reply and
    an ack, and hops that come one at a time no socket write for their acks.

    Reply before ack: an entry is acked only once a pipeline confirmed its reply. A
    replica killed in between leaves its answered entries pending: a sibling claims them
    after `claim_idle` and runs the hops again; the callers' routers ignore the duplicate
    replies (late replies). `close` sends the acks still owed (the drain on SIGTERM).

    `send` returns once the reply is written, and raises what the pipeline raised (the
    caller then retries that hop alone, ack included), or, for a reply Redis refused (its
    `reply_to` is a key of another type), that refusal for that reply alone: the replies
    batched with it are sent, and its entry is acked all the same.

    It is also the `rider` of the replica's reader (hookbus.bus.hops.pipelined_read): a read offered
    meanwhile goes out at the end of the next pipeline with replies, whose `send`s then
    return when that read does, at most `hookbus.bus.hops.pipelined_read.BLOCK_MS` later."""

    def __init__(
        self, client: aredis.Redis, group: str, *, ack_delay: float = ACK_DELAY, ack_ride_after: float | None = None
    ) -> None:
        """`ack_ride_after`: seconds after which the acks owed ride with the next replies
        (default ACK_RIDE_AFTER, at most `ack_delay`)."""
        self.client, self.group, self.ack_delay = client, group, ack_delay
        self.ack_ride_after = min(ACK_RIDE_AFTER, ack_delay) if ack_ride_after is None else ack_ride_after
        self._pending: list[tuple[str, Any, EntryRef, Onward | None, asyncio.Future[Any]]] = []
        self._unacked: dict[str, list[str]] = {}
        """Entries whose replies were written, by stream, waiting for their ack."""
        self._ack_timer: asyncio.TimerHandle | None = None
        self._acks_ride_from = 0.0
        """Loop time from which the acks owed ride with a pipeline of replies."""
        self._acks_due = False
        self._closed = False
        self._flushing: set[asyncio.Task[None]] = set()
        self._rides = RideSlot(client)
        self.batches = 0
        self.acks_sent = 0
        """XACK commands sent (one per stream per pipeline)."""

    async def send(self, reply_to: str, fields: Any, entry: EntryRef, onward: Onward | None = None) -> Any:
        """Write the reply (after `onward`, the route's next hop, in the same pipeline);
        returns Redis's answer to `onward` (an exception if it refused that one alone)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if not self._pending:  # the flush starts next turn, with every reply queued by then
            self._start_flush()
        self._pending.append((reply_to, fields, entry, onward, future))
        return await future

    def offer(self, ride: RideOffer) -> None:
        self._rides.offer(ride)

    @property
    def unacked(self) -> int:
        return sum(len(ids) for ids in self._unacked.values())

    def owed(self) -> set[EntryRef]:
        """The entries answered and not yet acked: the claim pass must not run them again."""
        return {(stream, entry_id) for stream, ids in self._unacked.items() for entry_id in ids}

    async def close(self) -> None:
        """Send every ack still owed (after the last reply was sent), once: what Redis
        does not take then stays pending, for a sibling to claim."""
        self._closed = self._acks_due = True
        self._cancel_ack_timer()
        while self._flushing:
            await asyncio.wait(set(self._flushing))
        if self._unacked:
            await self._flush()

    def _start_flush(self) -> None:
        task = asyncio.ensure_future(self._flush())
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    def _send_acks(self) -> None:
        self._ack_timer = None
        self._acks_due = True
        self._start_flush()

    def _cancel_ack_timer(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None

    def _owe_acks(self, entries: list[EntryRef]) -> None:
        for stream, entry_id in entries:
            self._unacked.setdefault(stream, []).append(entry_id)
        if self._unacked and self._ack_timer is None and not self._closed:
            loop = asyncio.get_running_loop()
            self._acks_ride_from = loop.time() + self.ack_ride_after
            self._ack_timer = loop.call_later(self.ack_delay, self._send_acks)

    async def _flush(self) -> None:
        batch, self._pending = self._pending, []
        acks: dict[str, list[str]] = {}
        if self._acks_due or (
            batch and self._ack_timer is not None and asyncio.get_running_loop().time() >= self._acks_ride_from
        ):
            acks, self._unacked, self._acks_due = self._unacked, {}, self._closed
            self._cancel_ack_timer()
        if not batch and not acks:
            return
        ride = self._rides.take() if batch else None
        try:
            # one pipeline even on a cluster: every ack in it is of an earlier, confirmed reply
            commands = Commands()
            for reply_to, fields, _, onward, _ in batch:
                if onward is not None:
                    commands.xadd(onward.stream, onward.fields)
                commands.xadd(reply_to, fields)
            for stream, entry_ids in acks.items():
                commands.xack(stream, self.group, *entry_ids)
            if ride is not None:
                ride.take(commands, len(batch))
            results = await execute(self.client, commands)
        except BaseException as exc:  # noqa: BLE001 - every waiter must hear of it
            if ride is not None:
                ride.failed(exc)
            self._owe_acks([(stream, i) for stream, ids in acks.items() for i in ids])  # XACK is idempotent
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception) else ConnectionError(str(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        self.batches += 1
        self.acks_sent += len(acks)
        if ride is not None:
            ride.arrived(results.pop())
        replies = len(batch) + sum(onward is not None for _, _, _, onward, _ in batch)
        for stream, result in zip(acks, results[replies:], strict=True):
            if isinstance(result, Exception):  # the group or stream is gone: nothing left to ack
                log.warning("ack_refused", stream=stream, error=str(result))
        answered = []
        position = 0
        for _, _, entry, onward, future in batch:
            sent_on = None
            if onward is not None:
                sent_on, position = results[position], position + 1
            replied, position = results[position], position + 1
            answered.append(entry)  # a refused reply is acked too: nobody can ever get it
            if isinstance(replied, Exception):
                settle(future, replied)
            elif not future.done():
                future.set_result(sent_on)
        self._owe_acks(answered)


class WorkerReplica(BusApp):
    def __init__(
        self,
        host: GroupHost,
        redis_url: str,
        *,
        prefix: str = "hookbus:",
        concurrency: int = WORKER_CONCURRENCY,
        replica: str | None = None,
        claim_idle: float = WORKER_CLAIM_IDLE,
        max_deliveries: int = WORKER_MAX_DELIVERIES,
        trim_every: float = TRIM_EVERY,
        ack_delay: float = ACK_DELAY,
        version: str | None = None,
    ) -> None:
        """`version`: what this replica runs its group at (default: from the environment
        or derived from the skills, hookbus.services.worker.versioning)."""
        self.host = host
        self.group = host.group
        super().__init__(redis_url, graceful_timeout=DRAIN_SECONDS)
        self.keys = keys_for(redis_url, prefix)
        self.hooks_fingerprint = hooks_fingerprint(host.announcement())
        self.version = replica_version(version, host.skills, self.hooks_fingerprint)
        self.pinned_streams = self.keys.pinned_hook_streams(self.group, self.version)
        self.streams = self.keys.hook_streams(self.group) + self.pinned_streams
        self.replica = replica or instance_name(f"worker-{self.group}")
        self.concurrency = concurrency
        self.claim_idle = claim_idle
        self.max_deliveries = max_deliveries
        self.trim_every = trim_every
        self.ack_delay = ack_delay
        settings = get_settings()
        self.max_hop_bytes = settings.max_hop_bytes
        self.max_state_bytes = settings.max_state_bytes
        self._in_flight: dict[EntryRef, float] = {}
        self._hop_tasks: set[asyncio.Task[Any]] = set()
        self._reader: ShardedGroupReader | None = None
        self._batcher: ReplyBatcher | None = None
        self._redis_url = redis_url
        self._client: aredis.Redis | None = None
        self._events: EventWriter | None = None
        self.member = GroupMember(
            OrphanRules(
                self.streams[0], self.group, self.replica, self.keys.replicas(self.group), claim_idle,
                count=max(100, concurrency * 4),
            ),
            client=self._redis, concurrency=concurrency, trim_every=trim_every,
            busy=lambda: self._in_flight, beat=self._heartbeat, renew=self._renew_leases,
            tidy=self.janitor_once, take_over=self._take_over, streams=self.streams,
            answered=lambda: self._batcher.owed() if self._batcher else (),
        )
        self.started = time.time()
        """When this replica started: its ReplicaInfo keeps it when it re-publishes (draining),
        so the version order and the console's "up for" do not move."""
        self.processed = 0
        self.dead_lettered = 0
        self.trimmed = 0
        self.observer: ObserverConsumer | None = None
        """Runs the group's observers from its observer stream (services/worker/observer.py)."""

    def declare_subscriber(self) -> None:
        """Declare `hooks:{group}` as this app's subscriber for the AsyncAPI document
        (services/docs.py). A serving replica does not call this: its own read loop
        consumes the stream (`_read_loop`), FastStream only runs the app's lifecycle."""

        @self.broker.subscriber(
            stream=StreamSub(
                self.streams[0],
                group=self.group,
                consumer=self.replica,
                max_records=self.concurrency,
                polling_interval=1000,
                last_id=">",
            ),
            ack_policy=AckPolicy.MANUAL,
            parser=raw_entry_parser,
            max_workers=self.concurrency,
            title=f"hooks:{self.group}",
            description=(
                "Lifecycle hops (HopEvent) for this worker group; hook hops carry the context "
                "and the stage data as entry fields `c` and `d`; replies go to reply_to."
            ),
        )
        async def on_hop(msg: RedisStreamMessage) -> None:
            entry_id = text(msg.raw_message["message_ids"][0])
            await self.process((self.streams[0], entry_id), msg.raw_message["data"], attempt=1)

    # ---------------------------------------------------------------- lifecycle

    async def _before_startup(self) -> None:
        """Create the consumer group at the stream's start, so no entry written before it is missed."""
        client = await self.broker.connect()
        for stream in self.streams:
            await ensure_group(client, stream, self.group)

    async def _after_startup(self) -> None:
        self._client = await self.broker.connect()
        self._events = EventWriter(self._client, self.keys)
        await self._events.start()
        await announce(self._client, self.keys, self.host.announcement())
        await self._check_siblings()
        await publish(self._client, self.keys, self.group, self.replica, self._info())
        await heartbeat(self._client, self.keys, self.group, self.replica)
        self.member.start()
        self._batcher = ReplyBatcher(self._client, self.group, ack_delay=self.ack_delay)
        self._reader = ShardedGroupReader(
            self._redis_url, self.streams, self.group, self.replica,
            free=self._free, deliver=self._deliver, block_ms=READ_BLOCK_MS,
            rider=self._batcher,
        )
        self._reader.start()
        if ObserverConsumer.wanted(self.host):
            self.observer = ObserverConsumer(
                self.host, self._redis_url, self.keys, self.replica, self._client, self._events,
                concurrency=self.concurrency, claim_idle=self.claim_idle, max_deliveries=self.max_deliveries,
                trim_every=self.trim_every, steadiness=self.member.steadiness,
            )
            await self.observer.start()
        log.info(
            "worker_started", group=self.group, replica=self.replica, version=self.version,
            hooks=self.hooks_fingerprint, concurrency=self.concurrency, claim_idle=self.claim_idle,
        )

    def _info(self, *, draining: bool = False) -> ReplicaInfo:
        return ReplicaInfo(version=self.version, hooks=self.hooks_fingerprint, draining=draining, started=self.started)

    async def _check_siblings(self) -> None:
        """Log a sibling that announces this version with other hooks: the version no
        longer says what runs (orchestrators report it too)."""
        client = self._redis()
        raw = await client.hgetall(self.keys.replica_versions(self.group))
        infos = parse_infos(raw, [text(name) for name in raw])
        for sibling, info in infos.items():
            if sibling != self.replica and info.version == self.version and info.hooks != self.hooks_fingerprint:
                log.error(
                    "version_hooks_differ", group=self.group, version=self.version, replica=self.replica,
                    hooks=self.hooks_fingerprint, sibling=sibling, sibling_hooks=info.hooks,
                )

    async def _on_shutdown(self) -> None:
        """Drain (hookbus.services.worker.drain), then read and claim nothing more, leave
        the registry, let in-flight hops finish (leases still renewed) for up to
        DRAIN_SECONDS."""
        if self._client is not None:
            with contextlib.suppress(*RECONNECT_ERRORS):
                await publish(self._client, self.keys, self.group, self.replica, self._info(draining=True))
                await serve_pinned_requests(
                    self._client, self.keys, self.group, self.replica, self.version,
                    limit=DRAIN_SECONDS, alive_within=self.claim_idle,
                )
        await self._stop_reading()
        if self.observer is not None:
            await self.observer.stop_reading()
        await self.member.stop("heartbeat", "claim", "janitor")
        if self._client is not None:
            with contextlib.suppress(*RECONNECT_ERRORS):
                await leave(self._client, self.keys, self.group, self.replica)
        busy = self._hop_tasks | self.member.taken
        if busy:
            await asyncio.wait(busy, timeout=DRAIN_SECONDS)

    async def _stop_reading(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            await reader.stop()

    async def _after_shutdown(self) -> None:
        """After in-flight hops finished: send the acks still owed, stop renewing leases
        and flush events."""
        await self.member.wait_taken(DRAIN_SECONDS)
        if self.observer is not None:
            await self.observer.stop(DRAIN_SECONDS)
        if self._batcher is not None:
            with contextlib.suppress(*RECONNECT_ERRORS):  # unacked, they are run again by a sibling
                await self._batcher.close()
        await self.member.stop()
        if self._client is not None:
            with contextlib.suppress(*RECONNECT_ERRORS):
                for stream in self.streams:
                    await delete_consumer_if_idle(self._client, stream, self.group, self.replica)
        if self._events is not None:
            await self._events.stop()
        log.info("worker_stopped", group=self.group, replica=self.replica, processed=self.processed)

    # ------------------------------------------------------------------ one hop

    async def process(self, entry: EntryRef, fields: dict[bytes, bytes], attempt: int) -> None:
        """One hop: `entry` is (the shard stream it was read from, its entry id)."""
        client = self._client
        assert client is not None
        try:
            event = decode(fields, HopEvent)
        except DecodeError as exc:
            await self._dead_letter(entry, fields, str(exc), event=None)
            return
        try:
            split = hop_parts(event, fields)
        except DecodeError as exc:
            await self._dead_letter(entry, fields, str(exc), event=event)
            return
        if event.deadline < time.time():
            await client.xack(entry[0], self.group, entry[1])
            self._record(event, None, Outcome.EXPIRED, f"deadline passed before attempt {attempt}")
            return
        self._in_flight[entry] = time.monotonic()
        try:
            with tracing.process_span(
                self.group, self.replica, event.lifecycle, event.trace, attempt, self.version
            ) as span:
                reply = await self.host.answer(event, attempt, self.replica, split)
                answered = time.time()  # the record's time: its hooks ended here, before the reply went out
                onward = send_on(event, reply, split)
                if onward is not None:
                    reply.forwarded = onward.hop_id
                reply, fields = self._encoded(reply)
                if reply.failure:
                    onward = None
                    span.error(reply.failure, "hop_failed")
            await self._reply(entry, event, fields, onward)
        finally:
            self._in_flight.pop(entry, None)
        self.processed += 1
        self._record(event, reply, Outcome.HOP_FAILED if reply.failure else Outcome.OK, reply.failure, at=answered)

    def _encoded(self, reply: HopReply) -> tuple[HopReply, dict[bytes, bytes]]:
        """The reply and its entry; if it cannot be encoded (a hook left a value in
        `ctx.state` or the session that is not JSON) or is over the size limits
        (hookbus.bus.limits.over_hop_limits), a failure reply instead. Left
        unanswered, the hop would be claimed and run again until dead-lettered, the
        caller waiting meanwhile: its hooks would run `max_deliveries` times for one
        failure."""
        try:
            fields = encode_reply(reply)
        except ValueError as exc:  # PydanticSerializationError, a circular reference
            return self._failed(reply, f"the hooks' results are not JSON: {exc}")
        size = sum(len(value) for value in fields.values())
        state_bytes = len(pydantic_core.to_json(reply.state)) if size > self.max_state_bytes else None
        over = over_hop_limits(size, state_bytes, self.max_hop_bytes, self.max_state_bytes)
        return (reply, fields) if over is None else self._failed(reply, over)

    def _failed(self, reply: HopReply, why: str) -> tuple[HopReply, dict[bytes, bytes]]:
        """A failure reply in place of `reply`, which cannot be sent: its hooks failed."""
        failure = HopReply(
            hop_id=reply.hop_id, completion_id=reply.completion_id, replica=self.replica,
            duration_ms=reply.duration_ms, failure=why,
        )
        log.error("reply_not_sendable", hop_id=reply.hop_id, completion_id=reply.completion_id, error=why)
        return failure, encode_reply(failure)

    async def _reply(
        self, entry: EntryRef, event: HopEvent, fields: dict[bytes, bytes], onward: Onward | None = None
    ) -> None:
        """Reply (batched with the other replies of this loop turn; the ack follows, see
        ReplyBatcher), after sending the stage on (`onward`); through an outage, or while
        Redis refuses writes for want of memory, both and the ack alone while the caller
        may still wait. Given up, the entry stays pending (and expires when claimed again)."""
        client = self._client
        assert client is not None
        if self._batcher is not None:
            try:
                await self._sent_on(event, onward, await self._batcher.send(event.reply_to, fields, entry, onward))
                return
            except RECONNECT_ERRORS:
                pass
            except ResponseError as exc:
                if not out_of_memory(exc):  # this reply_to cannot take a reply: nobody will get it
                    log.error("reply_refused", entry_id=entry[1], hop_id=event.hop_id, reply_to=event.reply_to, error=str(exc))
                    return  # the batcher acks its entry
                log.warning("reply_waiting_for_memory", hop_id=event.hop_id, completion_id=event.completion_id)

        def send(pipe: Any) -> None:
            if onward is not None:
                pipe.xadd(onward.stream, onward.fields)
            pipe.xadd(event.reply_to, fields)

        backoff = 0.05
        while True:
            try:
                results = await in_order(
                    client, send, lambda pipe: pipe.xack(entry[0], self.group, entry[1]), raise_on_error=False
                )
                sent_on, replied = (results[0], results[1]) if onward is not None else (None, results[0])
                if isinstance(replied, Exception):
                    raise replied
                await self._sent_on(event, onward, sent_on)
                return
            except _REPLY_ERRORS as exc:
                if not retryable(exc) or time.time() + backoff > event.deadline + REPLY_RETRY_GRACE:
                    log.error("reply_not_sent", entry_id=entry[1], hop_id=event.hop_id, error=str(exc))
                    raise
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    async def _sent_on(self, event: HopEvent, onward: Onward | None, result: Any) -> None:
        """If Redis refused the route's next hop, answer it as failed in its place, so
        the orchestrator, told that the stage was sent on, does not wait for it in vain."""
        if onward is None or not isinstance(result, Exception):
            return
        log.error("send_on_refused", hop_id=event.hop_id, onward=onward.hop_id, stream=onward.stream, error=str(result))
        failure = HopReply(
            hop_id=onward.hop_id, completion_id=event.completion_id, replica=self.replica,
            failure=f"could not be sent on to {onward.stream}: {result}",
        )
        client = self._client
        assert client is not None
        with contextlib.suppress(*RECONNECT_ERRORS, ResponseError):
            await client.xadd(event.reply_to, encode(failure))  # type: ignore[arg-type]

    def _record(
        self, event: HopEvent, reply: HopReply | None, outcome: Outcome, error: str | None, at: float | None = None
    ) -> None:
        if self._events is None:
            return
        if reply is not None and outcome == Outcome.OK:
            bad = [o for o in reply.outcomes if o.outcome != Outcome.OK]
            if reply.abort or bad:
                outcome = Outcome.ABORTED if reply.abort else bad[0].outcome
                error = (reply.abort or {}).get("message") or bad[0].error
        self._events.emit(
            MonitorRecord(
                kind="hop",
                completion_id=event.completion_id,
                lifecycle=event.lifecycle,
                hooks=[h.key for h in event.hooks] or ([f"tool:{event.tool.name}"] if event.tool else []),
                group=self.group,
                replica=self.replica,
                version=self.version,
                duration_ms=reply.duration_ms if reply else 0.0,
                outcome=outcome,
                error=error,
                ts=at or time.time(),
            )
        )

    async def _dead_letter(
        self, entry: EntryRef, fields: dict[bytes, bytes], reason: str, event: HopEvent | None
    ) -> None:
        """Move the entry aside; if we know who waits for it, tell them the hop failed."""
        client = self._client
        assert client is not None
        stream, entry_id = entry

        def set_aside(pipe: Any) -> None:
            add_dead_letter(
                pipe, self.keys.dead_letter, source=stream, entry_id=entry_id,
                reason=reason, fields=fields, consumer=self.replica,
            )
            if event is not None:
                failure = HopReply(
                    hop_id=event.hop_id, completion_id=event.completion_id,
                    replica=self.replica, failure=f"dead-lettered: {reason}",
                )
                pipe.xadd(event.reply_to, encode(failure))

        await in_order(client, set_aside, lambda pipe: pipe.xack(stream, self.group, entry_id))
        self.dead_lettered += 1
        log.warning("dead_lettered", stream=stream, entry_id=entry_id, reason=reason)
        if event is not None:
            self._record(event, None, Outcome.DEAD_LETTER, reason)

    # --------------------------------------------------------------- read loop

    def _free(self) -> int:
        return self.concurrency - len(self._in_flight)

    def _deliver(self, stream: str, entry_id: str, fields: dict[bytes, bytes]) -> None:
        entry = (stream, entry_id)
        self._in_flight[entry] = time.monotonic()
        task = asyncio.create_task(self._run_read(entry, fields))
        self._hop_tasks.add(task)
        task.add_done_callback(self._hop_tasks.discard)

    async def _run_read(self, entry: EntryRef, fields: dict[bytes, bytes]) -> None:
        try:
            await self.process(entry, fields, attempt=1)
        except RECONNECT_ERRORS as exc:
            log.warning("hop_failed", entry_id=entry[1], error=str(exc))
        except Exception:  # noqa: BLE001 - the entry stays pending; a sibling claims it
            log.exception("hop_failed", entry_id=entry[1])
        finally:
            self._in_flight.pop(entry, None)
            self._wake_reader()

    def _wake_reader(self) -> None:
        if self._reader is not None:
            self._reader.wake()

    # -------------------------------------------------------- background tasks

    @property
    def claimed(self) -> int:
        return self.member.claimed

    def _redis(self) -> aredis.Redis:
        assert self._client is not None, "the replica is not started"
        return self._client

    async def _heartbeat(self) -> None:
        await heartbeat(self._redis(), self.keys, self.group, self.replica)

    async def _renew_leases(self) -> None:
        """Keep claims on long-running hops fresh so siblings do not take them (per shard)."""
        by_stream: dict[str, list[str]] = {}
        for stream, entry_id in list(self._in_flight):
            by_stream.setdefault(stream, []).append(entry_id)
        for stream, ids in by_stream.items():
            await self._redis().xclaim(stream, self.group, self.replica, 0, ids, justid=True)  # type: ignore[arg-type]

    def _take_over(self, entry: Claimed) -> Awaitable[None]:
        self._in_flight[(entry.stream, entry.entry_id)] = time.monotonic()  # leased from now on
        return self._run_claimed(entry)

    async def _run_claimed(self, entry: Claimed) -> None:
        log.info(
            "claimed", entry_id=entry.entry_id, attempt=entry.attempt, replica=self.replica,
            previous_owner=entry.previous_owner,
        )
        ref = (entry.stream, entry.entry_id)
        try:
            if entry.attempt > self.max_deliveries:
                event = None
                with contextlib.suppress(DecodeError):
                    event = decode(entry.fields, HopEvent)
                await self._dead_letter(
                    ref, entry.fields, f"delivered {entry.attempt} times without an answer", event
                )
                return
            await self.process(ref, entry.fields, attempt=entry.attempt)
        except RECONNECT_ERRORS as exc:
            log.warning("claimed_hop_failed", entry_id=entry.entry_id, error=str(exc))
        finally:
            self._in_flight.pop(ref, None)
            self._wake_reader()

    async def janitor_once(self) -> int:
        """Trim every shard up to what was acked; forget siblings gone for long."""
        client = self._client
        assert client is not None
        removed = 0
        for stream in self.streams:
            removed += (await trim_acked(client, stream))[0]
            await prune_consumers(client, stream, self.group, self.keys.replicas(self.group))
        self.trimmed += removed
        return removed
