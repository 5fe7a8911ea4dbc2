"""The physical floor of a hop: raw redis-py, no hookbus, the same bytes on the wire.

Caller (this process): XADD {i: id, r: reply stream, p: payload} to a stream, then wait
for a future that one reader task resolves from XREAD on its reply stream (the same
shape as hookbus.bus.hops.reply_router.ReplyRouter, minus envelopes).

Worker (a second process, `python -m tests.bench.floor URL STREAM GROUP COUNT REPLY_BYTES`):
XREADGROUP COUNT entries (BLOCK 1 s), then one pipeline with an XADD reply (REPLY_BYTES
of opaque payload) and an XACK per entry. No decoding, no validation: the floor.

Relayed (`call(payload, via=STREAM)`): the first worker sends the entry on to `via`'s
worker instead of replying, and that one replies: a stage sent on from one group to the
next (hookbus.bus.hops.send_on) at the floor.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import uuid

import redis.asyncio as aredis

from hookbus.services.process import event_loop


class FloorCaller:
    def __init__(self, redis_url: str, stream: str, reply_stream: str) -> None:
        self.client = aredis.Redis.from_url(redis_url, max_connections=200)
        self.reader = aredis.Redis.from_url(redis_url)
        self.stream = stream
        self.reply_stream = reply_stream
        self.waiting: dict[bytes, asyncio.Future[bytes]] = {}
        self.task: asyncio.Task[None] | None = None
        self.stopping = False

    async def start(self) -> None:
        self.task = asyncio.create_task(self._read())

    async def call(self, payload: bytes, timeout: float = 10.0, *, via: str | None = None) -> bytes:
        """One round trip; with `via`, through this caller's stream's worker and then
        `via`'s, which replies."""
        hop_id = uuid.uuid4().hex.encode()
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.waiting[hop_id] = future
        fields = {b"i": hop_id, b"r": self.reply_stream, b"p": payload}
        if via is not None:
            fields[b"n"] = via.encode()
        try:
            await self.client.xadd(self.stream, fields)  # type: ignore[arg-type]
            return await asyncio.wait_for(future, timeout)
        finally:
            self.waiting.pop(hop_id, None)

    async def _read(self) -> None:
        last = "0-0"
        while not self.stopping:
            response = await self.reader.xread({self.reply_stream: last}, count=1000, block=1000)
            for _stream, entries in response or ():
                for entry_id, fields in entries:
                    last = entry_id
                    future = self.waiting.get(fields.get(b"i", b""))
                    if future is not None and not future.done():
                        future.set_result(fields[b"p"])

    async def stop(self) -> None:
        self.stopping = True
        await self.client.xadd(self.reply_stream, {b"i": b"wake", b"p": b""})
        if self.task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.task, 3)
        await self.client.delete(self.reply_stream, self.stream)
        await self.client.aclose()
        await self.reader.aclose()


async def serve(redis_url: str, stream: str, group: str, count: int, reply_bytes: int) -> None:
    client = aredis.Redis.from_url(redis_url)
    with contextlib.suppress(aredis.ResponseError):
        await client.xgroup_create(stream, group, id="0", mkstream=True)
    reply = b"x" * reply_bytes
    consumer = f"floor-{uuid.uuid4().hex[:6]}"
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    while not stop.is_set():
        response = await client.xreadgroup(group, consumer, {stream: ">"}, count=count, block=1000)
        for _stream, entries in response or ():
            async with client.pipeline(transaction=False) as pipe:
                for entry_id, fields in entries:
                    onward = fields.get(b"n")
                    if onward is None:
                        pipe.xadd(fields[b"r"], {b"i": fields[b"i"], b"p": reply})
                    else:  # relayed: the next worker replies
                        pipe.xadd(onward, {b"i": fields[b"i"], b"r": fields[b"r"], b"p": fields[b"p"]})
                    pipe.xack(stream, group, entry_id)
                await pipe.execute()
    await client.aclose()


if __name__ == "__main__":
    url, stream_name, group_name, batch, size = sys.argv[1:6]
    event_loop.run(serve(url, stream_name, group_name, int(batch), int(size)))  # the services' loop, for a fair floor
