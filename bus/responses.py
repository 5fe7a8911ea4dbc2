"""Writing a request's response stream: chunks pipelined in order, then one terminal item.

Chunks that arrive while an earlier write is in flight are sent together in the next
pipeline, so a fast stream costs far fewer round trips than chunks.
"""

from __future__ import annotations

import asyncio

import redis.asyncio as aredis

from bus.envelopes import ResponseItem, encode

RESPONSE_TTL = 3600
TERMINAL_KINDS = frozenset({"final", "error", "done"})


class ResponseWriter:
    def __init__(self, client: aredis.Redis, stream: str, ttl: int = RESPONSE_TTL) -> None:
        self._client = client
        self.stream = stream
        self._ttl = ttl
        self._pending: list[ResponseItem] = []
        self._drain: asyncio.Task[None] | None = None
        self.written = 0

    def add(self, item: ResponseItem) -> None:
        self._pending.append(item)
        if self._drain is None or self._drain.done():
            self._drain = asyncio.create_task(self._write_pending())

    async def finish(self, terminal: ResponseItem) -> None:
        """Write the terminal item after everything before it; returns once it is stored."""
        assert terminal.kind in TERMINAL_KINDS
        self.add(terminal)
        while self._drain is not None and not self._drain.done():
            await asyncio.shield(self._drain)
        if self._drain is not None:
            self._drain.result()
        if self._pending:  # a drain failed part way: write what is left now
            await self._write_pending()

    async def _write_pending(self) -> None:
        while self._pending:
            batch = self._pending[:]
            async with self._client.pipeline(transaction=False) as pipe:
                for item in batch:
                    pipe.xadd(self.stream, encode(item))  # type: ignore[arg-type]
                pipe.expire(self.stream, self._ttl)
                await pipe.execute()
            del self._pending[: len(batch)]
            self.written += len(batch)
