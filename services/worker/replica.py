"""One replica of a hook-worker group: a FastStream app on `hooks:{group}`.

- consumer group `{group}`, consumer name unique per replica (host + pid);
- bounded prefetch (`--concurrency N` entries read and in flight at most), so a second
  replica really takes work instead of one replica swallowing the backlog;
- reply first, then ack, in one pipelined round trip;
- entries left pending by a dead sibling are claimed after `claim_idle` seconds; long
  hooks renew their claim so nobody takes them while they are alive; an entry delivered
  more than `max_deliveries` times goes to the dead-letter stream and its caller is told;
- on SIGTERM, in-flight hops finish (FastStream's graceful timeout) and the replica
  leaves the registry; what it had not started stays pending for its siblings.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import redis.asyncio as aredis
import structlog
from faststream import FastStream
from faststream.middlewares import AckPolicy
from faststream.redis import RedisBroker, RedisStreamMessage, StreamSub

from bus.connection import RECONNECT_ERRORS, ensure_group, instance_name
from bus.deadletter import add_dead_letter, entry_id_text
from bus.envelopes import DecodeError, HopEvent, HopReply, MonitorRecord, decode, encode
from bus.events import EventWriter
from bus.keys import Keys
from bus.registry import HEARTBEAT_EVERY, announce, heartbeat, leave
from services.worker.host import GroupHost

log = structlog.get_logger("hookbus.worker")

DRAIN_SECONDS = 30.0


class WorkerReplica:
    def __init__(
        self,
        host: GroupHost,
        redis_url: str,
        *,
        prefix: str = "hookbus:",
        concurrency: int = 16,
        replica: str | None = None,
        claim_idle: float = 5.0,
        max_deliveries: int = 3,
    ) -> None:
        self.host = host
        self.group = host.group
        self.keys = Keys(prefix)
        self.stream = self.keys.hooks(self.group)
        self.replica = replica or instance_name(f"worker-{self.group}")
        self.concurrency = concurrency
        self.claim_idle = claim_idle
        self.max_deliveries = max_deliveries
        self.broker = RedisBroker(
            redis_url,
            graceful_timeout=DRAIN_SECONDS,
            logger=logging.getLogger("faststream.hookbus"),
            log_level=logging.DEBUG,
            retry_on_error=list(RECONNECT_ERRORS[:3]),
        )
        self.app = FastStream(
            self.broker,
            after_startup=[self._after_startup],
            on_startup=[self._before_startup],
            on_shutdown=[self._on_shutdown],
        )
        self._in_flight: dict[str, float] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._client: aredis.Redis | None = None
        self._events: EventWriter | None = None
        self.processed = 0
        self._subscribe()

    def _subscribe(self) -> None:
        @self.broker.subscriber(
            stream=StreamSub(
                self.stream,
                group=self.group,
                consumer=self.replica,
                max_records=self.concurrency,
                polling_interval=1000,
                last_id=">",
            ),
            ack_policy=AckPolicy.MANUAL,
            max_workers=self.concurrency,
            title=f"hooks:{self.group}",
            description="Lifecycle hops (HopEvent) for this worker group; replies go to reply_to.",
        )
        async def on_hop(msg: RedisStreamMessage) -> None:
            entry_id = entry_id_text(msg.raw_message["message_ids"][0])
            await self.process(entry_id, msg.raw_message["data"], attempt=1)

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start without FastStream's signal handling (tests, `hookbus run`)."""
        await self._before_startup()
        await self.broker.start()
        await self._after_startup()

    async def stop(self) -> None:
        await self._on_shutdown()
        await self.broker.stop()

    async def _before_startup(self) -> None:
        """Create the consumer group at the stream's start, so no entry written before it is missed."""
        await ensure_group(await self.broker.connect(), self.stream, self.group)

    async def _after_startup(self) -> None:
        self._client = await self.broker.connect()
        self._events = EventWriter(self._client, self.keys.events)
        await self._events.start()
        await announce(self._client, self.keys, self.host.announcement())
        await heartbeat(self._client, self.keys, self.group, self.replica)
        self._tasks = [
            asyncio.create_task(self._heartbeat_loop(), name="hookbus-heartbeat"),
            asyncio.create_task(self._claim_loop(), name="hookbus-claim"),
            asyncio.create_task(self._lease_loop(), name="hookbus-lease"),
        ]
        log.info("worker_started", group=self.group, replica=self.replica, concurrency=self.concurrency)

    async def _on_shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._client is not None:
            with contextlib.suppress(*RECONNECT_ERRORS):
                await leave(self._client, self.keys, self.group, self.replica)
        if self._events is not None:
            await self._events.stop()
        log.info("worker_stopped", group=self.group, replica=self.replica, processed=self.processed)

    # ------------------------------------------------------------------ one hop

    async def process(self, entry_id: str, fields: dict[bytes, bytes], attempt: int) -> None:
        client = self._client
        assert client is not None
        try:
            event = decode(fields, HopEvent)
        except DecodeError as exc:
            await self._dead_letter(entry_id, fields, str(exc), event=None)
            return
        if event.deadline < time.time():
            await client.xack(self.stream, self.group, entry_id)
            self._record(event, None, "expired", f"deadline passed before attempt {attempt}")
            return
        self._in_flight[entry_id] = time.monotonic()
        try:
            reply = await self.host.answer(event, attempt, self.replica)
        finally:
            self._in_flight.pop(entry_id, None)
        async with client.pipeline(transaction=False) as pipe:
            pipe.xadd(event.reply_to, encode(reply))  # type: ignore[arg-type]
            pipe.xack(self.stream, self.group, entry_id)
            await pipe.execute()
        self.processed += 1
        self._record(event, reply, "failed" if reply.failure else "ok", reply.failure)

    def _record(self, event: HopEvent, reply: HopReply | None, outcome: str, error: str | None) -> None:
        if self._events is None:
            return
        if reply is not None and outcome == "ok":
            bad = [o for o in reply.outcomes if o.outcome != "ok"]
            if reply.abort or bad:
                outcome = "aborted" if reply.abort else bad[0].outcome
                error = (reply.abort or {}).get("message") or bad[0].error
        self._events.emit(
            MonitorRecord(
                kind="hop",
                completion_id=event.completion_id,
                lifecycle=event.lifecycle,
                hooks=[h.key for h in event.hooks] or ([f"tool:{event.tool.name}"] if event.tool else []),
                group=self.group,
                replica=self.replica,
                duration_ms=reply.duration_ms if reply else 0.0,
                outcome=outcome,
                error=error,
            )
        )

    async def _dead_letter(
        self, entry_id: str, fields: dict[bytes, bytes], reason: str, event: HopEvent | None
    ) -> None:
        """Move the entry aside; if we know who waits for it, tell them the hop failed."""
        client = self._client
        assert client is not None
        async with client.pipeline(transaction=False) as pipe:
            add_dead_letter(
                pipe, self.keys.dead_letter, source=self.stream, entry_id=entry_id,
                reason=reason, fields=fields, consumer=self.replica,
            )
            if event is not None:
                failure = HopReply(
                    hop_id=event.hop_id, completion_id=event.completion_id,
                    replica=self.replica, failure=f"dead-lettered: {reason}",
                )
                pipe.xadd(event.reply_to, encode(failure))  # type: ignore[arg-type]
            pipe.xack(self.stream, self.group, entry_id)
            await pipe.execute()
        log.warning("dead_lettered", stream=self.stream, entry_id=entry_id, reason=reason)
        if event is not None:
            self._record(event, None, "dead_letter", reason)

    # -------------------------------------------------------- background tasks

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_EVERY)
            try:
                assert self._client is not None
                await heartbeat(self._client, self.keys, self.group, self.replica)
            except RECONNECT_ERRORS as exc:
                log.warning("heartbeat_failed", error=str(exc))

    async def _lease_loop(self) -> None:
        """Keep claims on long-running hops fresh so siblings do not take them."""
        while True:
            await asyncio.sleep(self.claim_idle / 3)
            ids = list(self._in_flight)
            if not ids or self._client is None:
                continue
            with contextlib.suppress(*RECONNECT_ERRORS):
                await self._client.xclaim(
                    self.stream, self.group, self.replica, 0, ids, justid=True
                )

    async def _claim_loop(self) -> None:
        """Take over entries a dead sibling left pending longer than `claim_idle`."""
        idle_ms = int(self.claim_idle * 1000)
        while True:
            await asyncio.sleep(self.claim_idle / 2)
            try:
                await self._claim_once(idle_ms)
            except RECONNECT_ERRORS as exc:
                log.warning("claim_failed", error=str(exc))

    async def _claim_once(self, idle_ms: int) -> None:
        client = self._client
        assert client is not None
        claimed = await client.xautoclaim(
            self.stream, self.group, self.replica, idle_ms, start_id="0-0", count=self.concurrency
        )
        entries = [(entry_id_text(i), f) for i, f in claimed[1] if f is not None]
        if not entries:
            return
        async with client.pipeline(transaction=False) as pipe:
            for entry_id, _ in entries:
                pipe.xpending_range(self.stream, self.group, min=entry_id, max=entry_id, count=1)
            pending = await pipe.execute()
        for (entry_id, fields), info in zip(entries, pending, strict=True):
            deliveries = int(info[0]["times_delivered"]) if info else 1
            log.info("claimed", entry_id=entry_id, deliveries=deliveries, replica=self.replica)
            if deliveries > self.max_deliveries:
                event = None
                with contextlib.suppress(DecodeError):
                    event = decode(fields, HopEvent)
                await self._dead_letter(
                    entry_id, fields, f"delivered {deliveries} times without an answer", event
                )
                continue
            asyncio.create_task(self.process(entry_id, fields, attempt=deliveries))
