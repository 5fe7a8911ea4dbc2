"""Request/reply over Redis Streams: one reply stream per process, one reader task.

A hop is XADD to the worker group's stream (the hops sent in one event-loop turn in one
pipeline: hookbus.bus.connection.batched_appends); the worker's reply lands on this process's
`replies:{instance}` stream, where a single reader resolves the waiting future by
`hop_id`. That is one round trip each way and no per-call subscription, unlike a
temporary reply channel per call. A reply that comes after its caller gave up is
dropped (logged), never applied.

Right after the reader resolved replies, its next XREAD is offered to ride with the hops
those replies lead to (hookbus.bus.hops.pipelined_read): a request's hops in a row cost one socket
write each, the hop and the read of its reply together (not on a Redis Cluster). While
no hop waits for a reply (an LLM call between two stages, an idle orchestrator) the
reader reads nothing; the next hop sent wakes it, and its read rides with that hop. The
reply of a hop whose worker sent the stage on (hookbus.bus.hops.send_on) leads to no hop: after
only such replies the next read goes at once, as the next group's reply may already be
there.

A reply entry larger than a hop may be (HOOKBUS_MAX_HOP_BYTES: workers refuse to write
one, but nothing forces a worker of another language or build to) is not decoded: its hop
fails ("over a hop's limit") and its bytes are trimmed with the rest, so whatever wrote
it, a reply cannot make the orchestrator parse and keep more than the limit.

The replies read are trimmed away by the reader (no one else reads this stream): every
TRIM_EVERY replies or TRIM_BYTES of them while hops keep coming, and once no hop waited
for IDLE_TRIM seconds, so large hook data does not outlive its request in Redis.

Per hop the caller pays for little more than the round trip: its hop id is a counter
after a random prefix (`new_hop_id`, no uuid4 per hop), and the deadlines of all waiting
hops share one timer (`_Deadlines`), not a wait_for with its own timer and futures each.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import re
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import redis.asyncio as aredis
import structlog
from redis.exceptions import ResponseError

from hookbus.bus.connection.batched_appends import StreamAppender
from hookbus.bus.connection.retrying import RECONNECT_ERRORS, out_of_memory
from hookbus.bus.connection.values import text
from hookbus.bus.groups.dead_letters import send_dead_letter
from hookbus.bus.hops.pipelined_read import LINGER, RideOffer, ride
from hookbus.bus.settings import get_settings
from hookbus.bus.wire.envelopes import FIELD, DecodeError, HopEvent, HopReply, decode, encode
from hookbus.skills.errors import RedisOutOfMemory

log = structlog.get_logger("hookbus.router")

TRIM_EVERY = 256
"""Replies read between two trims of the reply stream while hops keep coming."""
IDLE_TRIM = 1.0
"""Seconds with no hop waiting after which the replies read are trimmed (not at once: the
next hop of a request usually follows its reply within milliseconds, and its read rides
with it)."""
TRIM_BYTES = 1024 * 1024
"""Bytes of replies read that trim the stream at once (large hook data must not linger)."""
SEND_BACKOFF = 0.05
"""Seconds before a hop whose send failed on a connection error is sent again (then doubling)."""
COMPACT_AT = 1024
_HOP_ID = re.compile(rb'"hop_id"\s*:\s*"([^"\\]{1,200})"')
"""Deadlines kept before the answered ones are swept out of the heap (when most are)."""


class HopTimeout(TimeoutError):
    """No reply within the hop's deadline."""


class HopUnsent(HopTimeout):
    """The hop could not be sent (Redis unreachable through the client's retries): like
    a timeout, it counts as the segment's hooks failing."""


class HopLost(HopTimeout):
    """Every replica that could answer the hop is gone (its version has no live replica
    left: hookbus.services.orchestrator.serving.version_pins); no reply will come, so its wait ends
    now, not at its deadline."""


class _Deadlines:
    """The deadlines of the waiting hops under one timer, armed for the soonest. A hop
    answered in time stays in the heap until it comes up (or the heap is compacted) and
    is skipped then, so a hop costs a heap push, not a timer of its own."""

    def __init__(self, waiting: dict[str, asyncio.Future[HopReply]]) -> None:
        self._waiting = waiting
        self._heap: list[tuple[float, str]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for = math.inf

    def add(self, loop: asyncio.AbstractEventLoop, at: float, hop_id: str) -> None:
        """Fail `hop_id`'s future with TimeoutError at loop time `at` unless it is done by then."""
        if len(self._heap) >= COMPACT_AT and len(self._heap) > 4 * len(self._waiting):
            self._heap = [entry for entry in self._heap if self._pending(entry[1])]
            heapq.heapify(self._heap)
        heapq.heappush(self._heap, (at, hop_id))
        if at < self._armed_for:
            self._arm(loop, at)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._armed_for, self._heap = None, math.inf, []

    def _pending(self, hop_id: str) -> bool:
        future = self._waiting.get(hop_id)
        return future is not None and not future.done()

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._armed_for = loop.call_at(at, self._fire, loop), at

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer, self._armed_for = None, math.inf
        now = loop.time()
        heap = self._heap
        while heap and (heap[0][0] <= now or not self._pending(heap[0][1])):
            at, hop_id = heapq.heappop(heap)
            future = self._waiting.get(hop_id)
            if at <= now and future is not None and not future.done():
                future.set_exception(TimeoutError())
        if heap:
            self._arm(loop, heap[0][0])


class ReplyRouter:
    def __init__(
        self,
        client: aredis.Redis,
        reader: aredis.Redis,
        reply_stream: str,
        *,
        dead_letter: str | None = None,
        linger: float = LINGER,
        max_reply_bytes: int | None = None,
    ) -> None:
        """`reader` is a client without retries (hookbus.bus.connection.retrying.connect(url, retries=0));
        `dead_letter` the stream bad replies are copied to (None: only logged); `linger`
        how long a read offered to ride waits for a flush (hookbus.bus.hops.pipelined_read);
        `max_reply_bytes` the largest reply entry decoded (default HOOKBUS_MAX_HOP_BYTES)."""
        self._client = client
        self._appender = StreamAppender(client)
        self._reader_client = reader
        self.reply_stream = reply_stream
        self.dead_letter = dead_letter
        self.linger = linger
        self.bad_replies = 0
        self.sends_retried = 0
        """Hop sends made again after a connection error (`_send`)."""
        self.max_reply_bytes = get_settings().max_hop_bytes if max_reply_bytes is None else max_reply_bytes
        self.oversized_replies = 0
        self._background: set[asyncio.Task[None]] = set()
        self._waiting: dict[str, asyncio.Future[HopReply]] = {}
        self._last_id: bytes | str = "0-0"
        self._since_trim = 0
        self._bytes_since_trim = 0
        self._idle_trim: asyncio.TimerHandle | None = None
        self._deadlines = _Deadlines(self._waiting)
        self._hop_prefix = uuid.uuid4().hex[:16]
        self._hop_numbers = itertools.count()
        self._reader: asyncio.Task[None] | None = None
        self._wanted = asyncio.Event()
        """Set when a hop is sent or expected: wakes a reader that had nothing to read for."""
        self._stopping = False
        self.late_replies = 0
        self.rides = 0

    async def start(self) -> None:
        if self._reader is None:
            self._reader = asyncio.create_task(self._read_replies(), name="hookbus-reply-reader")

    async def stop(self) -> None:
        self._stopping = True
        self._wanted.set()
        if self._reader is not None:
            # Wake the blocked XREAD with an entry rather than cancelling it: redis-py can
            # swallow a cancellation mid-read and keep blocking.
            with contextlib.suppress(*RECONNECT_ERRORS):
                await self._client.xadd(self.reply_stream, {"wake": "stop"})
            try:
                await asyncio.wait_for(self._reader, 3)
            except (TimeoutError, asyncio.CancelledError):
                self._reader.cancel()
            self._reader = None
        if self._idle_trim is not None:
            self._idle_trim.cancel()
            self._idle_trim = None
        await self._reader_client.aclose()
        self._deadlines.cancel()
        for future in self._waiting.values():
            future.cancel()
        with contextlib.suppress(*RECONNECT_ERRORS):
            await self._client.delete(self.reply_stream)

    def new_hop_id(self) -> str:
        """An id no other hop of any process or restart has: 64 random bits chosen when
        this router was made, then this router's count of hops."""
        return f"{self._hop_prefix}{next(self._hop_numbers):x}"

    async def call(
        self, stream: str, event: HopEvent, timeout: float, fields: dict[bytes, bytes] | None = None
    ) -> HopReply:
        """Send one hop and wait for its reply; HopTimeout when none comes within
        `timeout` seconds of the call (sending included); RedisOutOfMemory (a 503 that
        ends the request) when Redis refuses the hop at `maxmemory`. `fields`: the entry
        already encoded (hookbus.bus.wire.envelopes.encode_hop), else `encode(event)`."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[HopReply] = loop.create_future()
        hop_id = event.hop_id
        self._waiting[hop_id] = future
        self._wanted.set()  # before the send: the reader's read then rides with it
        self._deadlines.add(loop, loop.time() + timeout, hop_id)
        try:
            try:
                await self._send(stream, fields or encode(event), loop.time() + timeout)
            except ResponseError as exc:
                if out_of_memory(exc):  # the request cannot go on: the 503 every path gives
                    raise RedisOutOfMemory() from exc
                raise
            return await future
        except (HopUnsent, HopLost):
            raise
        except TimeoutError as exc:
            raise HopTimeout(f"no reply from {stream} within {timeout:g}s") from exc
        finally:
            self._waiting.pop(hop_id, None)
            if future.done() and not future.cancelled():
                future.exception()  # a deadline that passed while the send failed: heard of

    async def _send(self, stream: str, fields: dict[bytes, bytes], deadline: float) -> None:
        """XADD a hop; through a connection error (Redis restarting, or a connection its
        restart closed) again after SEND_BACKOFF, doubling up to a second, while the hop's
        deadline (loop time) allows, then HopUnsent. Before, a hop sent in an outage of a
        second failed its hooks at once. If the error came after Redis stored the entry, the
        hop is in the stream twice: its second reply is dropped as late, as a claimed
        hop's is."""
        loop = asyncio.get_running_loop()
        backoff = SEND_BACKOFF
        while True:
            try:
                await self._appender.add(stream, fields)
                return
            except RECONNECT_ERRORS as exc:
                if loop.time() + backoff >= deadline:
                    raise HopUnsent(f"could not send to {stream}: {exc}") from exc
                if backoff == SEND_BACKOFF:
                    log.warning("hop_not_sent_yet", stream=stream, error=str(exc))
                self.sends_retried += 1
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    def append(self, stream: str, fields: dict[bytes, bytes]) -> asyncio.Future[None]:
        """XADD an entry that expects no reply (a request's observations), in the same
        per-turn pipeline as the hops (hookbus.bus.connection.batched_appends); the future
        says when Redis stored it. Urgent: the request's end waits for it."""
        return self._appender.enqueue(stream, fields, urgent=True)

    def expect(self, hop_ids: Sequence[str]) -> None:
        """Keep the replies of these hops, which workers send on a route
        (hookbus.bus.hops.send_on), for `wait`; register them before sending the hop whose
        worker sends them on, as their replies may come before that hop's reply is used."""
        loop = asyncio.get_running_loop()
        for hop_id in hop_ids:
            self._waiting[hop_id] = loop.create_future()
        self._wanted.set()

    async def wait(self, hop_id: str, timeout: float) -> HopReply:
        """The reply of an expected hop, HopTimeout when none comes within `timeout`
        seconds from now."""
        future = self._waiting[hop_id]
        loop = asyncio.get_running_loop()
        self._deadlines.add(loop, loop.time() + timeout, hop_id)
        try:
            return await future
        except HopLost:
            raise
        except TimeoutError as exc:
            raise HopTimeout(f"no reply to hop {hop_id} within {timeout:g}s") from exc
        finally:
            self._waiting.pop(hop_id, None)

    def lost(self, hop_id: str, why: str) -> None:
        """No reply to `hop_id` can come (`why`): its `call` or `wait` raises HopLost now."""
        future = self._waiting.get(hop_id)
        if future is not None and not future.done():
            future.set_exception(HopLost(why))

    def forget(self, hop_ids: Iterable[str]) -> None:
        """Stop expecting these hops: a reply that still comes is dropped as late."""
        for hop_id in hop_ids:
            future = self._waiting.pop(hop_id, None)
            if future is not None and not future.done():
                future.cancel()

    async def _read_replies(self) -> None:
        backoff = 0.05
        writes_coming = False
        while not self._stopping:
            if not any(not future.done() for future in self._waiting.values()):
                # nobody waits for a reply: no read until a hop is sent, and then with it;
                # idle for IDLE_TRIM, the replies read go, so an idle process keeps none
                self._wanted.clear()
                if self._since_trim and self._idle_trim is None:
                    self._idle_trim = asyncio.get_running_loop().call_later(IDLE_TRIM, self._trim_if_idle)
                await self._wanted.wait()
                writes_coming = True
                continue
            try:
                writes_coming = await self._read_once(writes_coming)
                backoff = 0.05
            except RECONNECT_ERRORS as exc:
                if self._stopping:  # redis-py may turn our cancel into a read error
                    return
                log.warning("reply_reader_reconnecting", error=str(exc), retry_in=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                writes_coming = False
                continue
            if self._since_trim >= TRIM_EVERY or self._bytes_since_trim >= TRIM_BYTES:
                await self._trim(_after(self._last_id))

    def _trim_if_idle(self) -> None:
        self._idle_trim = None
        if self._since_trim and not any(not future.done() for future in self._waiting.values()):
            task = asyncio.create_task(self._trim(_after(self._last_id)))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _trim(self, minid: str) -> None:
        """Drop the replies before `minid` (read: nobody else reads this stream)."""
        self._since_trim = self._bytes_since_trim = 0
        with contextlib.suppress(*RECONNECT_ERRORS):
            await self._reader_client.xtrim(self.reply_stream, minid=minid)

    async def _read_once(self, after_replies: bool) -> bool:
        """One read of replies, riding with the next hops if replies were just resolved
        that lead to some; whether this one resolved such replies."""
        if after_replies:
            rode = await ride(self._appender, RideOffer(self._queue_read, self._take), self.linger)
            if rode is not None:
                self.rides += 1
                return rode
        response: Any = await self._reader_client.xread(
            {self.reply_stream: self._last_id}, count=1000, block=2000
        )
        return self._take(response)

    def _queue_read(self, pipe: Any, riding: int, block_ms: int) -> None:
        pipe.xread({self.reply_stream: self._last_id}, count=1000, block=block_ms)

    def _take(self, response: Any) -> bool:
        """Resolve the replies of one XREAD; whether writes are likely to follow (an
        entry other than the reply of a hop whose worker sent the stage on: the caller
        of that one waits for the next group's reply instead of sending anything, so the
        next read must not wait for a write to ride with)."""
        writes_coming = False
        for _stream, entries in response or ():
            for entry_id, fields in entries:
                self._last_id = entry_id
                size = sum(len(value) for value in fields.values())
                writes_coming |= self._resolve(entry_id, fields) if size <= self.max_reply_bytes else self._oversized(fields, size)
                self._since_trim += 1
                self._bytes_since_trim += size
        return writes_coming

    def _resolve(self, entry_id: bytes | str, fields: dict[bytes, bytes]) -> bool:
        """Hand a reply to its waiter; False for the reply of a hop sent on."""
        if b"wake" in fields:
            return True
        try:
            reply = decode(fields, HopReply)
        except DecodeError as exc:
            self.bad_replies += 1
            log.warning("bad_reply_dropped", reason=str(exc), stream=self.reply_stream)
            if self.dead_letter is not None:
                task = asyncio.create_task(self._dead_letter(text(entry_id), fields, str(exc)))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            return True
        future = self._waiting.get(reply.hop_id)
        if future is None or future.done():
            self.late_replies += 1
            log.info("late_reply_ignored", hop_id=reply.hop_id, completion_id=reply.completion_id)
            return True
        future.set_result(reply)
        return reply.forwarded is None

    def _oversized(self, fields: dict[bytes, bytes], size: int) -> bool:
        """A reply over the limit fails its hop undecoded: the first hop id in its envelope
        that a caller waits for (a forged one can only fail a hop of this process)."""
        self.oversized_replies += 1
        why = f"the reply is {size:,} bytes, over a hop's limit of {self.max_reply_bytes:,} (HOOKBUS_MAX_HOP_BYTES)"
        for match in _HOP_ID.finditer(fields.get(FIELD, b"")):
            future = self._waiting.get(match.group(1).decode(errors="replace"))
            if future is not None and not future.done():
                log.error("oversized_reply", hop_id=match.group(1).decode(errors="replace"), bytes=size, stream=self.reply_stream)
                future.set_result(HopReply(hop_id=match.group(1).decode(), completion_id="", replica="", failure=why))
                return True
        log.error("oversized_reply", hop_id=None, bytes=size, stream=self.reply_stream)
        return True

    async def _dead_letter(self, entry_id: str, fields: dict[bytes, bytes], reason: str) -> None:
        assert self.dead_letter is not None
        with contextlib.suppress(*RECONNECT_ERRORS):
            await send_dead_letter(
                self._client, self.dead_letter, source=self.reply_stream, entry_id=entry_id,
                reason=reason, fields=fields, consumer=self.reply_stream,
            )


def _after(entry_id: bytes | str) -> str:
    """The smallest stream id after `entry_id` (XTRIM MINID keeps ids from it on)."""
    ms, seq = text(entry_id).split("-")
    return f"{ms}-{int(seq) + 1}"
