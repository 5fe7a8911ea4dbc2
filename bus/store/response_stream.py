"""Writing a request's response stream: chunks pipelined in order, then one terminal item.

Chunks that arrive while an earlier write is in flight are sent together in the next
batch, so a fast stream costs far fewer round trips than chunks. A batch is one entry of
the response stream (a ResponseBatch of its items, hookbus.bus.wire.envelopes), so it costs
one XADD too; readers unpack it (hookbus.bus.wire.envelopes.response_items).

A batch goes out at least `LINGER` seconds after the one before it started (the first:
after the first item was added), unless an item added `at_once` is in it (the
orchestrator's first chunk that carries text or a tool call: the time to first token does
not wait; the role-only chunk before it goes with it); so a stream faster than that costs
a batch per `LINGER`, not one per write's round trip (each batch is a journal script of
3-4 commands, and an entry the reader reads). What is still held when `finish` is called
goes with the terminal item, in its script. The price: a chunk after the first text
reaches the reader up to `LINGER` later (an answer's last chunks do not wait: `finish`
takes them), and a first item not added `at_once` up to `LINGER` later.

With a `Fence` (the orchestrator always gives one), each batch is one journal script
(hookbus.bus.store.journal) that writes only while the request's epoch is still the writer's, and
the terminal item goes with the request's ack in one script (`finish`). A fenced-out
writer drops what it holds, calls `on_fenced` and writes nothing more. A writer whose
journal is gone (Redis lost its data: hookbus.bus.store.journal, LOST) drops its chunks,
calls `on_lost`, and stores only the terminal item. A batch that
failed because Redis was unreachable is retried with backoff, in order; each batch's
entry id, numbered by the items before it, makes a retried batch idempotent, so no chunk
is stored twice.

A write Redis refuses for want of memory (`maxmemory`, policy noeviction) is retried the
same way, but never given up: the request's lease is still renewed meanwhile (the
renewal script's first write, XCLAIM, is not refused at maxmemory), so no other
orchestrator takes the request over, and the terminal item and the ack are stored, once,
when memory returns. It is logged when it starts and when it ends, not at each retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis.asyncio as aredis
import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from hookbus.bus.connection.retrying import RECONNECT_ERRORS, out_of_memory, retryable
from hookbus.bus.store.journal import FENCED, LOST, Journal
from hookbus.bus.wire.envelopes import FIELD, ResponseItem, encode_response_batch

log = structlog.get_logger("hookbus.responses")

RESPONSE_TTL = 3600
TERMINAL_KINDS = frozenset({"final", "error", "done"})
RETRY_CAP = 1.0
LINGER = 0.01
"""Least time between the starts of two batches of one writer (module docstring)."""
_WRITE_ERRORS = (*RECONNECT_ERRORS, ResponseError)
"""What a write may fail with: those worth a retry are sorted out by `retryable`."""


class Fenced(RuntimeError):
    """The request was claimed by another orchestrator; this writer must stop."""


@dataclass
class Fence:
    """The request's journal and the epoch this writer holds."""

    journal: Journal
    completion_id: str
    epoch: int
    steps: list[str] = field(default_factory=list)
    """The run's step fields in the journal (hookbus.bus.store.run_steps), blanked by `finish`."""


@dataclass(frozen=True)
class Ack:
    """The request entry to ack together with the terminal item."""

    requests: str
    group: str
    entry_id: str


class ResponseWriter:
    def __init__(
        self,
        client: aredis.Redis,
        stream: str,
        ttl: int = RESPONSE_TTL,
        *,
        fence: Fence | None = None,
        on_fenced: Callable[[], None] | None = None,
        on_lost: Callable[[], None] | None = None,
        first_seq: int = 0,
        linger: float = LINGER,
    ) -> None:
        """`first_seq` is the journal's item count when this writer starts (0 for a new
        run; -1 when unknown, as in a recovery, which writes only the terminal item);
        `linger`: least time between the starts of two batches (module docstring)."""
        self._linger = linger
        self._client = client
        self.stream = stream
        self._ttl = ttl
        self._fence = fence
        self._on_fenced = on_fenced
        self._on_lost = on_lost
        self._seq = first_seq
        self._ttl_set_at: float | None = None
        """Monotonic time this writer's first batch set the stream's TTL (None: not set)."""
        self._pending: list[ResponseItem] = []
        self._drain: asyncio.Task[None] | None = None
        self._next_batch_at: float | None = None
        """Monotonic time before which no batch starts (the linger after the last one, or
        after the first item; None: no item yet)."""
        self._finishing = False
        """Set by `finish`: the drain leaves what it holds to it."""
        self._wake = asyncio.Event()
        """Ends the drain's linger early (`finish`, an item added `at_once`)."""
        self.written = 0
        self.fenced = False
        self.lost = False
        self.owned_at: float | None = None
        """Monotonic time the last journal write that found this writer's epoch current
        was sent (None: none yet, or unfenced)."""
        self.refused_since: float | None = None
        """Monotonic time Redis started refusing this writer's writes for want of memory."""

    def add(self, item: ResponseItem, *, at_once: bool = False) -> None:
        """Queue `item`; `at_once`: its batch does not wait out the linger."""
        if self.fenced or self.lost:
            return
        self._pending.append(item)
        if at_once:
            self._next_batch_at = 0.0
            self._wake.set()
        elif self._next_batch_at is None:
            self._next_batch_at = time.monotonic() + self._linger
        if self._drain is None or self._drain.done():
            self._drain = asyncio.create_task(self._write_pending())

    async def finish(self, terminal: ResponseItem, *, ack: Ack | None = None, give_up_after: float = 120.0) -> bool:
        """Write the terminal item after everything before it (and ack `ack` in the same
        step when fenced); returns once it is stored: True, or False if fenced out.

        Raises a connection error if Redis stays unreachable for `give_up_after` seconds;
        waits as long as it takes while Redis refuses the writes for want of memory.
        """
        assert terminal.kind in TERMINAL_KINDS
        if self.fenced:
            return False
        self._finishing = True
        self._wake.set()
        while self._drain is not None and not self._drain.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._drain), give_up_after)
            except TimeoutError as exc:
                if self.refused_since is not None:
                    continue
                await self.close()
                raise RedisConnectionError(f"{self.stream}: Redis unreachable for {give_up_after:g}s") from exc
        if self.fenced:
            return False
        self._pending.append(terminal)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + give_up_after
        backoff = 0.05
        while True:
            try:
                if self._fence is None:
                    await self._pipeline(self._pending[:])
                    if ack is not None:
                        await self._client.xack(ack.requests, ack.group, ack.entry_id)
                    self.written += len(self._pending)
                    self._pending.clear()
                    self._stored()
                    return True
                stored = await self._finish_fenced(ack)
                self._stored()
                return stored
            except _WRITE_ERRORS as exc:
                if not retryable(exc) or (not out_of_memory(exc) and loop.time() + backoff > deadline):
                    raise
                backoff = await self._wait_to_retry(exc, backoff)

    async def close(self) -> None:
        """Stop writing (drop what is not stored yet)."""
        if self._drain is not None and not self._drain.done():
            self._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError, *RECONNECT_ERRORS, Fenced):
                await self._drain
        self._pending.clear()

    # ---------------------------------------------------------------- internals

    async def _finish_fenced(self, ack: Ack | None) -> bool:
        fence = self._fence
        assert fence is not None and ack is not None, "a fenced writer acks with its terminal item"
        batch = self._pending[:]
        result = await fence.journal.finish(
            fence.completion_id, self.stream, fence.epoch, batch,
            ttl=self._ttl, requests=ack.requests, group=ack.group, entry_id=ack.entry_id,
            first_seq=self._seq, renew_ttl=self._ttl_is_stale(), steps=fence.steps,
        )
        if result == FENCED:
            self._fenced_out()
            return False
        self.written += len(batch)
        self._pending.clear()
        return True

    def _ttl_is_stale(self) -> bool:
        """Whether `finish` must set the stream's TTL again: yes, unless this writer's
        first batch set it less than half a TTL ago (the stream then outlives the terminal
        item by at least half a TTL, and the client deletes it once read)."""
        return self._ttl_set_at is None or time.monotonic() - self._ttl_set_at > self._ttl / 2

    async def _write_pending(self) -> None:
        backoff = 0.05
        while self._pending and not (self.fenced or self.lost or self._finishing):
            wait = (self._next_batch_at or 0.0) - time.monotonic()
            if wait > 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
                continue
            self._next_batch_at = time.monotonic() + self._linger
            batch = self._pending[:]
            try:
                if self._fence is None:
                    await self._pipeline(batch)
                else:
                    await self._write_fenced(batch)
            except _WRITE_ERRORS as exc:
                if not retryable(exc):
                    raise
                backoff = await self._wait_to_retry(exc, backoff)
                continue
            self._stored()
            backoff = 0.05
            if self.fenced or self.lost:
                return
            del self._pending[: len(batch)]
            self.written += len(batch)

    async def _wait_to_retry(self, exc: Exception, backoff: float) -> float:
        """Sleep before the next attempt; returns the backoff after it."""
        if not out_of_memory(exc):
            log.warning("response_write_retry", stream=self.stream, error=str(exc), retry_in=backoff)
        elif self.refused_since is None:
            self.refused_since = time.monotonic()
            log.warning(
                "response_write_waiting_for_memory", completion_id=self._completion_id,
                stream=self.stream, error=str(exc),
            )
        await asyncio.sleep(backoff)
        return min(backoff * 2, RETRY_CAP)

    def _stored(self) -> None:
        if self.refused_since is not None:
            waited = time.monotonic() - self.refused_since
            self.refused_since = None
            log.info(
                "response_write_resumed", completion_id=self._completion_id, stream=self.stream,
                waited_s=round(waited, 1),
            )

    @property
    def _completion_id(self) -> str | None:
        return self._fence.completion_id if self._fence is not None else None

    async def _pipeline(self, batch: list[ResponseItem]) -> None:
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.xadd(self.stream, {FIELD: encode_response_batch(batch)})
            pipe.expire(self.stream, self._ttl)
            await pipe.execute()

    async def _write_fenced(self, batch: list[ResponseItem]) -> None:
        fence = self._fence
        assert fence is not None
        sent_at = time.monotonic()
        result = await fence.journal.write(
            fence.completion_id, self.stream, fence.epoch, batch,
            ttl=self._ttl, first_seq=self._seq,
        )
        if result == FENCED:
            self._fenced_out()
            return
        if result == LOST:
            self._lost()
            return
        self.owned_at = sent_at
        if self._seq == 0:  # the first batch: the script set the stream's TTL
            self._ttl_set_at = sent_at
        if self._seq >= 0:
            self._seq = result

    def _lost(self) -> None:
        self.lost = True
        self._pending.clear()
        log.warning("response_writer_lost_its_journal", stream=self.stream)
        if self._on_lost is not None:
            self._on_lost()

    def _fenced_out(self) -> None:
        if self.fenced:
            return
        self.fenced = True
        self._pending.clear()
        log.warning("response_writer_fenced", stream=self.stream)
        if self._on_fenced is not None:
            self._on_fenced()
