"""The monitor firehose: a capped `events` stream with one record per hop and stage.

Records are buffered and written in one pipelined XADD batch every few milliseconds, so
monitoring never adds a round trip to a request's path. With several event shards (a
Redis Cluster) a record goes to its completion id's shard: the firehose load spreads
over the nodes as the requests do, and one request's records stay in order in one stream.
"""

from __future__ import annotations

import asyncio
import contextlib

import redis.asyncio as aredis
import structlog

from hookbus.bus.connection import RECONNECT_ERRORS
from hookbus.bus.envelopes import MonitorRecord, encode
from hookbus.bus.keys import Keys
from hookbus.bus.periodic import cancel_and_wait

log = structlog.get_logger("hookbus.events")

EVENTS_MAXLEN = 100_000
FLUSH_EVERY = 0.02
MAX_BUFFER = 50_000


class EventWriter:
    def __init__(self, client: aredis.Redis, keys: Keys) -> None:
        self._client = client
        self._keys = keys
        self._buffer: list[MonitorRecord] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
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

    async def flush(self) -> None:
        if not self._buffer:
            return
        batch, self._buffer = self._buffer, []
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for record in batch:
                    pipe.xadd(
                        self._keys.events_for(record.completion_id), encode(record),  # type: ignore[arg-type]
                        maxlen=EVENTS_MAXLEN // self._keys.shards, approximate=True,
                    )
                await pipe.execute()
        except RECONNECT_ERRORS:
            self._buffer[:0] = batch[-(MAX_BUFFER - len(self._buffer)) :]
            raise

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
