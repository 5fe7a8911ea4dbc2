"""A worker replica whose hop path is a plain XREADGROUP loop instead of FastStream's
subscriber dispatch; everything else as services/worker/replica.py (same GroupHost,
same decode/answer/encode, reply before ack, announce + heartbeat, monitor records).

The loop: read at most as many entries as there are free slots (`--concurrency`, so the
prefetch bound is exact: a replica never holds entries it cannot start), one task per
entry; replies finished in the same event-loop turn are written together: one pipeline
with their XADDs and a single XACK of all their ids (`--no-batch`: one pipeline per hop,
as today).

An entry in the split wire format of tests.bench.experiments.codec (orchestrator side:
fast_runtime) is answered in that format, a classic one as today; `--no-events` emits no
monitor records (to price the EventWriter).

    python -m tests.bench.experiments.lean_worker --group G pkg.mod:Skill [--concurrency N]
        [--no-batch] [--no-events]

Claiming, leases and dead-lettering (replica.py's background loops) are left out: they
are off the hop's path and would stay as they are.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
from typing import Any

from hookbus.bus.connection import connect, ensure_group, instance_name
from hookbus.bus.deadletter import entry_id_text
from hookbus.bus.envelopes import DecodeError, HopEvent, MonitorRecord, decode, encode
from hookbus.bus.events import EventWriter
from hookbus.bus.keys import Keys
from hookbus.bus.registry import HEARTBEAT_EVERY, announce, heartbeat, leave
from tests.bench.experiments.codec import CTX, answer_split


class ReplyBatcher:
    """Replies ready in one loop turn go out in one pipeline: their XADDs, one XACK."""

    def __init__(self, client: Any, stream: str, group: str) -> None:
        self.client, self.stream, self.group = client, stream, group
        self.pending: list[tuple[str, dict[bytes, bytes], str, asyncio.Future[None]]] = []
        self.scheduled = False

    async def send(self, reply_to: str, fields: dict[bytes, bytes], entry_id: str) -> None:
        future = asyncio.get_running_loop().create_future()
        self.pending.append((reply_to, fields, entry_id, future))
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(self._flush()))
        await future

    async def _flush(self) -> None:
        batch, self.pending, self.scheduled = self.pending, [], False
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for reply_to, fields, _, _ in batch:
                    pipe.xadd(reply_to, fields)
                pipe.xack(self.stream, self.group, *(entry_id for _, _, entry_id, _ in batch))
                await pipe.execute()
        except Exception as exc:  # noqa: BLE001
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for *_, future in batch:
            if not future.done():
                future.set_result(None)


class LeanReplica:
    def __init__(
        self, host: Any, redis_url: str, *, prefix: str = "hookbus:", concurrency: int = 16,
        replica: str | None = None, batch: bool = True, events: bool = True,
    ) -> None:
        self.host = host
        self.group = host.group
        self.keys = Keys(prefix)
        self.stream = self.keys.hooks(self.group)
        self.replica = replica or instance_name(f"lean-{self.group}")
        self.concurrency = concurrency
        self.client = connect(redis_url)
        self.reader = connect(redis_url, retries=0)
        self.events = EventWriter(self.client, self.keys.events) if events else None
        self.batcher = ReplyBatcher(self.client, self.stream, self.group) if batch else None
        self.free = concurrency
        self.slot = asyncio.Event()
        self.running = True
        self.processed = 0
        self.tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        await ensure_group(self.client, self.stream, self.group)
        if self.events is not None:
            await self.events.start()
        await announce(self.client, self.keys, self.host.announcement())
        await heartbeat(self.client, self.keys, self.group, self.replica)
        beat = asyncio.create_task(self._heartbeat_loop())
        try:
            await self._read_loop()
        finally:
            beat.cancel()
            if self.tasks:
                await asyncio.wait(self.tasks, timeout=30)
            with contextlib.suppress(Exception):
                await leave(self.client, self.keys, self.group, self.replica)
            if self.events is not None:
                await self.events.stop()
            await self.client.aclose()
            await self.reader.aclose()

    async def _read_loop(self) -> None:
        while self.running:
            while self.free <= 0:
                self.slot.clear()
                await self.slot.wait()
            response = await self.reader.xreadgroup(
                self.group, self.replica, {self.stream: ">"}, count=self.free, block=1000
            )
            for _stream, entries in response or ():
                for entry_id, fields in entries:
                    self.free -= 1
                    task = asyncio.create_task(self._one(entry_id_text(entry_id), fields))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)

    async def _one(self, entry_id: str, fields: dict[bytes, bytes]) -> None:
        try:
            await self.process(entry_id, fields)
        finally:
            self.free += 1
            self.slot.set()

    async def process(self, entry_id: str, fields: dict[bytes, bytes]) -> None:
        try:
            event = decode(fields, HopEvent)
        except DecodeError:
            await self.client.xack(self.stream, self.group, entry_id)  # (replica.py dead-letters it)
            return
        if CTX in fields:
            out = await answer_split(self.host, event, fields, 1, self.replica)
            reply = None
        else:
            reply = await self.host.answer(event, 1, self.replica)
            out = encode(reply)
        if self.batcher is not None:
            await self.batcher.send(event.reply_to, out, entry_id)
        else:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.xadd(event.reply_to, out)
                pipe.xack(self.stream, self.group, entry_id)
                await pipe.execute()
        self.processed += 1
        if self.events is not None:
            self.events.emit(
                MonitorRecord(
                    kind="hop", completion_id=event.completion_id, lifecycle=event.lifecycle,
                    hooks=[h.key for h in event.hooks], group=self.group, replica=self.replica,
                    duration_ms=reply.duration_ms if reply is not None else 0.0,
                )
            )

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_EVERY)
            with contextlib.suppress(Exception):
                await heartbeat(self.client, self.keys, self.group, self.replica)


def main() -> None:
    from hookbus.bus.settings import get_settings
    from hookbus.services.logs import configure_logging
    from hookbus.services.specs import load_skill
    from hookbus.services.worker.host import GroupHost

    parser = argparse.ArgumentParser()
    parser.add_argument("--group", required=True)
    parser.add_argument("skills", nargs="+")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--no-batch", action="store_true")
    parser.add_argument("--no-events", action="store_true")
    args = parser.parse_args()
    configure_logging()
    settings = get_settings()

    async def serve() -> None:
        replica = LeanReplica(
            GroupHost(args.group, [load_skill(s) for s in args.skills]), settings.redis_url or "",
            prefix=settings.prefix, concurrency=args.concurrency,
            batch=not args.no_batch, events=not args.no_events,
        )
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, lambda: setattr(replica, "running", False))
        started = time.time()
        await replica.run()
        print(f"lean replica processed {replica.processed} hops in {time.time() - started:.0f}s")

    asyncio.run(serve())


if __name__ == "__main__":
    main()
