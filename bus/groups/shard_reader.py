"""Consumer-group reads of a sharded stream: one XREADGROUP loop per shard.

A consumer (an orchestrator on `requests`, a worker replica on its group's hook stream)
reads every shard of what it consumes. On a Redis Cluster the shards sit in different
slots, and a command may only name keys of one slot, so each shard gets its own
blocking read; on a single Redis there is one shard and one loop, as before.

Each loop whose last read found entries (an active stream) reads as many entries as
its share of the consumer's free capacity (`ceil(free / active streams)`); a loop whose
last read found none reads one (blocking until it comes), so in flight + prefetched
stays within `capacity + streams - 1` (exactly `capacity` with one stream), a sibling
replica still gets work, and the one busy stream of several (a worker replica's version
stream beside its group's shared one) gets the whole capacity. A Redis error makes that loop alone back off (50 ms doubling to 2 s): a
failover or a slot migration never turns into a hot loop, and the other shards keep
being read. A missing group (the stream was deleted, a master restarted empty) is
created again.

A reader may be given a `rider`, the worker's reply pipeline
(hookbus.services.worker.replica.ReplyBatcher): right after it delivered entries, it
offers its next XREADGROUP to ride with their replies (hookbus.bus.hops.pipelined_read), so a steady
flow of hops costs the worker one socket write per hop. A ride reads as many entries as
are free plus the replies it carries, whose slots free as it returns: in flight +
prefetched may exceed the capacity by those replies for the moment between the two.
The rider holds one offer: of two loops that offer at once (a replica's shared and
version streams), the later one rides and the other reads alone after the linger.

A reader whose entries nobody waits for (a group's observers) may `linger`: after a read
that delivered entries, but fewer than it asked for (the stream had no more), it waits
that long before it reads again, and the next read takes everything that arrived
meanwhile in one command (their acks then go in one XACK too). A read that came back full
is followed at once, so a backlog drains at the consumer's pace.
Nothing changes for delivery: what is not read yet waits in the stream, what was read is
pending until acked.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import structlog
from redis.exceptions import ResponseError

from hookbus.bus.connection.cluster import ready
from hookbus.bus.connection.retrying import RECONNECT_ERRORS, connect, ensure_group
from hookbus.bus.connection.values import text
from hookbus.bus.groups.periodic import cancel_and_wait
from hookbus.bus.hops.pipelined_read import BLOCK_MS, RideOffer, Rider, ride

log = structlog.get_logger("hookbus.shard_reader")

BACKOFF_START = 0.05
BACKOFF_CAP = 2.0

Deliver = Callable[[str, str, dict[bytes, bytes]], None]
"""Called with (stream, entry id, fields) for each entry read; it must count the entry
as in flight before it returns (the next read sizes itself by the free capacity)."""


class ShardedGroupReader:
    def __init__(
        self,
        redis_url: str,
        streams: Sequence[str],
        group: str,
        consumer: str,
        *,
        free: Callable[[], int],
        deliver: Deliver,
        block_ms: int = 1000,
        rider: Rider | None = None,
        linger: float = 0.0,
    ) -> None:
        """`free()`: how many more entries the consumer can take now; `rider`, `linger`
        (seconds): see the module docstring (`rider` is used with a single shard only)."""
        self.streams = list(streams)
        self.group = group
        self.consumer = consumer
        self._free = free
        self._deliver = deliver
        self._block_ms = block_ms
        self._linger = linger
        self._client = connect(redis_url, max_connections=len(self.streams) + 4, retries=0)
        self._slot = asyncio.Event()
        self._active: set[str] = set()
        """Streams whose last read found entries."""
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._rider = rider
        self._rides: dict[str, RideOffer] = {}
        """The read each stream's loop offered to the rider, while it is out."""
        self.ride_block_ms = BLOCK_MS
        self.errors = 0
        self.rides = 0
        """Reads that went out with replies."""
        self.deliveries = 0
        """Reads that brought entries."""
        self.delivered = 0
        """Entries those reads brought."""

    def start(self) -> None:
        self._stopping = False
        self._tasks = [asyncio.create_task(self._start_loops(), name="hookbus-read-start")]

    async def _start_loops(self) -> None:
        backoff = BACKOFF_START
        while not self._stopping:
            try:
                await ready(self._client)
                break
            except RECONNECT_ERRORS as exc:
                log.warning("read_connecting", error=str(exc), retry_in=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_CAP)
        self._tasks += [
            asyncio.create_task(self._read(stream), name=f"hookbus-read-{stream}") for stream in self.streams
        ]

    def wake(self) -> None:
        """Capacity was freed: loops waiting for it read again."""
        self._slot.set()

    async def stop(self) -> None:
        """Read nothing more; what was not read stays in the streams for the siblings."""
        self._stopping = True
        self._slot.set()
        for offer in list(self._rides.values()):
            if offer.taken:  # its entries are delivered before we go
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(offer.done), offer.block_ms / 1000 + 2.0)
        await cancel_and_wait(*self._tasks, timeout=3.0)
        self._tasks = []
        with contextlib.suppress(Exception):
            await self._client.aclose()

    async def _read(self, stream: str) -> None:
        backoff = BACKOFF_START
        delivered = caught_up = False
        while not self._stopping:
            try:
                if caught_up and self._linger:
                    caught_up = False
                    await asyncio.sleep(self._linger)
                if delivered:
                    delivered = False
                    rode = await self._rode(stream)
                    if rode is not None:
                        self.rides += 1
                        delivered, backoff = rode, BACKOFF_START
                        continue
                free = self._free()
                if free <= 0:
                    self._slot.clear()
                    await self._slot.wait()
                    continue
                count = self._count(stream, free)
                response: Any = await self._client.xreadgroup(
                    self.group, self.consumer, {stream: ">"}, count=count, block=self._block_ms,
                )
                backoff = BACKOFF_START
            except RECONNECT_ERRORS as exc:
                if self._stopping:  # redis-py may turn our cancel into a read error
                    return
                self.errors += 1
                log.warning("read_reconnecting", stream=stream, error=str(exc), retry_in=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_CAP)
                continue
            except ResponseError as exc:
                self.errors += 1
                if "NOGROUP" in str(exc):
                    log.warning("read_group_missing", stream=stream, group=self.group)
                    with contextlib.suppress(*RECONNECT_ERRORS):
                        await ensure_group(self._client, stream, self.group)
                else:
                    log.error("read_refused", stream=stream, error=str(exc), retry_in=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_CAP)
                continue
            before = self.delivered
            delivered = self._deliver_response(stream, response)
            caught_up = delivered and self.delivered - before < count

    def _count(self, stream: str, free: int) -> int:
        """How many entries a read of `stream` may take now (module docstring)."""
        if stream not in self._active:
            return 1
        return -(-free // len(self._active))

    async def _rode(self, stream: str) -> bool | None:
        """The next read offered to the rider: None if no reply flush took it within the
        linger (read alone), else whether the read it rode with delivered entries."""
        if self._rider is None:
            return None

        def queue(pipe: Any, riding: int, block_ms: int) -> None:
            pipe.xreadgroup(
                self.group, self.consumer, {stream: ">"}, count=max(1, self._free() + riding), block=block_ms
            )

        offer = self._rides[stream] = RideOffer(
            queue, lambda response: self._deliver_response(stream, response), self.ride_block_ms
        )
        try:
            return await ride(self._rider, offer)
        finally:
            del self._rides[stream]

    def _deliver_response(self, stream: str, response: Any) -> bool:
        delivered = False
        for _stream, entries in response or ():
            for raw_id, fields in entries:
                self._deliver(stream, text(raw_id), fields)
                self.delivered += 1
                delivered = True
        self.deliveries += delivered
        if delivered:
            self._active.add(stream)
        else:
            self._active.discard(stream)
        return delivered
