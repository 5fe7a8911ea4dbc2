"""Deleting the response streams a client has read to their end, several in one DEL.

A client used to delete a request's stream as it read the terminal item, before handing
that item to its caller: one command and one round trip a request, paid on the request's
path. Here the streams read to their end wait in a set, and one DEL goes out `SWEEP_EVERY`
seconds after the first of them (at once when `MAX_KEYS` are waiting), off the request's
path. A stream waits at most that much longer in Redis; one whose client died before the
sweep expires by the TTL its writer set (hookbus.bus.store.response_stream), as it did
when the client died before its DEL. On a Redis Cluster redis-py sends one DEL per slot.
"""

from __future__ import annotations

import asyncio
import contextlib

import redis.asyncio as aredis

from hookbus.bus.connection.retrying import RECONNECT_ERRORS

SWEEP_EVERY = 0.2
"""Seconds the first stream read to its end waits for others to go in the same DEL: at
5 requests a second or more, their streams share a DEL."""
MAX_KEYS = 256
"""Streams waiting that make the DEL go at once (it stays a small command)."""


class ReadAnswers:
    """The response streams read to their end, deleted together (module docstring)."""

    def __init__(self, client: aredis.Redis, *, every: float = SWEEP_EVERY) -> None:
        self._client = client
        self._every = every
        self._waiting: set[str] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._sweeps: set[asyncio.Task[None]] = set()

    def read(self, stream: str) -> None:
        """`stream` was read to its terminal item: nobody needs it any more."""
        self._waiting.add(stream)
        if len(self._waiting) >= MAX_KEYS:
            self._sweep_now()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._every, self._sweep_now)

    async def reused(self, stream: str) -> None:
        """A request is about to be sent under the id of `stream`: if it waits here, delete it
        now, or its reader would find the answer it held (a caller that gives its own
        completion ids and reuses one once its answer was read gets the 409 it did before).
        A sweep under way may hold it: it is waited for."""
        if stream in self._waiting:
            self._waiting.discard(stream)
            await self._delete([stream])
        await self._swept()

    async def close(self) -> None:
        """Delete what is waiting, and wait for the sweeps under way."""
        self._sweep_now()
        await self._swept()

    async def _swept(self) -> None:
        if self._sweeps:
            await asyncio.wait(set(self._sweeps))

    def _sweep_now(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._waiting:  # `reused` took the last one
            return
        streams, self._waiting = list(self._waiting), set()
        task = asyncio.ensure_future(self._delete(streams))
        self._sweeps.add(task)
        task.add_done_callback(self._sweeps.discard)

    async def _delete(self, streams: list[str]) -> None:
        with contextlib.suppress(*RECONNECT_ERRORS):  # they expire anyway
            await self._client.delete(*streams)
