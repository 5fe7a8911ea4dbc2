"""The monitor firehose: a capped `events` stream of records of hops, stage segments and requests.

Records are buffered and flushed every FLUSH_EVERY seconds, so monitoring never adds a
round trip to a request's path. One flush of one writer is one XADD per events shard:
the entry's field `e` is a MonitorBatch envelope
(`{"v": 1, "kind": "batch", "records": [MonitorRecord, ...]}`) holding every record of
that flush for that shard, in the order they were emitted (at most MAX_RECORDS_PER_ENTRY
per entry). Readers decode entries with hookbus.bus.wire.envelopes.monitor_records, which
also reads the one-record entries (a bare MonitorRecord in `e`) that writers before
batching wrote, so a deployment being upgraded keeps its monitor and metrics; a reader
from before batching skips batch entries as undecodable (upgrade readers first).

With several event shards (a Redis Cluster) a record goes to its completion id's shard:
the firehose load spreads over the nodes as the requests do, and one request's records
stay in one stream. Entries of different writers interleave, so records within a
stream are in time order per writer, not overall (readers sort by `ts`).

The cap counts records: XADD's MAXLEN counts entries, so each writer trims to
EVENTS_MAXLEN (split over the shards) divided by the mean number of records in its own
entries; the streams keep about EVENTS_MAXLEN records at any load.
"""

from __future__ import annotations

import asyncio
import contextlib

import redis.asyncio as aredis
import structlog

from hookbus.bus.connection.retrying import RECONNECT_ERRORS
from hookbus.bus.groups.periodic import cancel_and_wait
from hookbus.bus.keys import Keys
from hookbus.bus.wire.envelopes import MonitorRecord, encode_monitor_batch

log = structlog.get_logger("hookbus.events")

EVENTS_MAXLEN = 100_000
"""About how many records the events streams keep, all shards together."""
FLUSH_EVERY = 0.1
"""Records wait up to this long: fewer, larger entries (the monitor and metrics lag by as much)."""
MAX_BUFFER = 50_000
MAX_RECORDS_PER_ENTRY = 500
"""Bounds one entry (a backlog after an outage goes out in several)."""
MEAN_WEIGHT = 0.05
"""Weight of one entry in the running mean of records per entry (the cap follows the load)."""


class EventWriter:
    def __init__(self, client: aredis.Redis, keys: Keys, *, max_records: int = EVENTS_MAXLEN) -> None:
        self._client = client
        self._keys = keys
        self._max_records_per_shard = max(1, max_records // keys.shards)
        self._buffer: list[MonitorRecord] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._records_per_entry = 1.0
        self.dropped = 0

    def emit(self, record: MonitorRecord) -> None:
        if len(self._buffer) >= MAX_BUFFER:
            self.dropped += 1  # Redis unreachable for long: monitoring gives way, requests do not
            return
        self._buffer.append(record)
        self._wakeup.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._flush_loop(), name="hookbus-events")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        with contextlib.suppress(*RECONNECT_ERRORS):
            await self.flush()

    @property
    def entry_cap(self) -> int:
        """MAXLEN (in entries) of one events shard, from this writer's records per entry."""
        return max(1, int(self._max_records_per_shard / self._records_per_entry))

    async def flush(self) -> None:
        if not self._buffer:
            return
        batch, self._buffer = self._buffer, []
        entries = self._entries(batch)
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for stream, records in entries:
                    pipe.xadd(stream, encode_monitor_batch(records), maxlen=self.entry_cap, approximate=True)  # type: ignore[arg-type]
                await pipe.execute()
        except RECONNECT_ERRORS:
            self._buffer[:0] = batch[-(MAX_BUFFER - len(self._buffer)) :]
            raise
        for _stream, records in entries:
            self._records_per_entry += MEAN_WEIGHT * (len(records) - self._records_per_entry)

    def _entries(self, batch: list[MonitorRecord]) -> list[tuple[str, list[MonitorRecord]]]:
        """(events shard, its records in emit order), split at MAX_RECORDS_PER_ENTRY."""
        by_stream: dict[str, list[MonitorRecord]] = {}
        for record in batch:
            by_stream.setdefault(self._keys.events_for(record.completion_id), []).append(record)
        return [
            (stream, records[start : start + MAX_RECORDS_PER_ENTRY])
            for stream, records in by_stream.items()
            for start in range(0, len(records), MAX_RECORDS_PER_ENTRY)
        ]

    async def _flush_loop(self) -> None:
        """Monitor records are best effort: a batch Redis refuses (out of memory) is
        dropped; trouble is logged when it starts and when it ends."""
        failing = False
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            await asyncio.sleep(FLUSH_EVERY)
            try:
                await self.flush()
            except Exception as exc:  # noqa: BLE001 - the loop must outlive any one batch
                if not failing:
                    log.warning("events_flush_failed", error=str(exc))
                    failing = True
                await asyncio.sleep(0.5)
                continue
            if failing:
                log.info("events_flush_recovered")
                failing = False
