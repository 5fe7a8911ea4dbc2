"""Server-Sent Events for streamed completions, and noticing a client that went away.

`DisconnectWatcher` reads the ASGI `receive` channel once the body is in: the next
message a server sends there is `http.disconnect`. Waiting on it, rather than only
noticing failed writes, catches a client that leaves while the stream is quiet (a slow
hook, a long tool call) or before the first chunk.

A client that stays connected but stops reading makes a write wait (the server's buffers
are full); a write that waits `stall_timeout` seconds ends the response as if the client
had left (`client_stalled`): its run is cancelled, its key's slot freed, its connection
closed. Time the stream waits for the model is not a stall: only a write counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from hookbus.services.gateway.cancel import CLIENT_DISCONNECTED, CLIENT_STALLED, GATEWAY_STOPPED
from hookbus.services.gateway.edge_options import STALL_TIMEOUT

T = TypeVar("T")

DONE = b"data: [DONE]\n\n"
MAX_READY_FRAMES = 256
"""Frames read ahead of a client that reads slowly, at most (then reading waits)."""
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def sse_event(payload: dict[str, Any], event: str | None = None) -> bytes:
    """One event: `data: {payload}`, after an `event: {event}` line if a name is given."""
    data = b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
    return b"event: " + event.encode() + b"\n" + data if event else data


def sse_comment(text: str) -> bytes:
    """An SSE comment line: progress that standard SSE clients (the openai SDK among them) skip."""
    return b": " + " ".join(text.splitlines()).encode() + b"\n\n"


class ClientGone(Exception):
    """The client disconnected."""


class DisconnectWatcher:
    """Sets `gone` when the server reports the client disconnected."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.gone = asyncio.Event()
        self._task = asyncio.create_task(self._watch(), name="hookbus-gateway-disconnect")

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.gone.set()
                return

    async def race(self, awaitable: Awaitable[T]) -> T:
        """The awaitable's result; ClientGone (and the awaitable cancelled) if the client left first."""
        task = asyncio.ensure_future(awaitable)
        gone = asyncio.ensure_future(self.gone.wait())
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if task.cancelled():
            raise ClientGone
        return task.result()

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task


class SSEResponse(Response):
    """A response that sends `frames` as they come and stops when the client leaves.

    `on_gone` is awaited when the stream ended without `frames` running out (the client
    disconnected, a write failed, or the server is shutting down).
    """

    def __init__(  # not Response.__init__: that renders a body, this streams one
        self,
        frames: AsyncIterator[bytes],
        watcher: DisconnectWatcher,
        on_gone: Callable[[str], Awaitable[None]],
        headers: dict[str, str] | None = None,
        *,
        stall_timeout: float = STALL_TIMEOUT,
    ) -> None:
        self.frames = frames
        self.watcher = watcher
        self.on_gone = on_gone
        self.stall_timeout = stall_timeout
        self._writing_since: float | None = None
        """Loop time the write under way started (None: no write waits)."""
        self.status_code = 200
        self.background = None
        self.body = b""
        self.raw_headers = SSE_HEADERS + [
            (k.lower().encode(), v.encode()) for k, v in (headers or {}).items()
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        finished = False
        reason = CLIENT_DISCONNECTED
        pump = asyncio.create_task(self._pump(send), name="hookbus-gateway-sse")
        gone = asyncio.ensure_future(self.watcher.gone.wait())
        stalled = asyncio.ensure_future(self._stalled())
        try:
            await asyncio.wait({pump, gone, stalled}, return_when=asyncio.FIRST_COMPLETED)
            if stalled.done() and not pump.done():
                reason = CLIENT_STALLED
            if pump.done():
                exc = pump.exception()
                if exc is None:
                    finished = True
                elif not isinstance(exc, OSError | ClientGone):
                    raise exc
        except asyncio.CancelledError:
            reason = GATEWAY_STOPPED
            raise
        finally:
            gone.cancel()
            stalled.cancel()
            if not pump.done():
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pump
            aclose = getattr(self.frames, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            await self.watcher.close()
            if not finished:
                await asyncio.shield(self.on_gone(reason))

    async def _stalled(self) -> None:
        """Returns once a write has waited `stall_timeout` seconds for the client: a look
        every quarter of it at when the write under way began (a timer, not an event per
        write, keeps writes as cheap as they were)."""
        loop = asyncio.get_running_loop()
        while self._writing_since is None or loop.time() - self._writing_since < self.stall_timeout:  # noqa: ASYNC110
            await asyncio.sleep(self.stall_timeout / 4)

    async def _send(self, send: Send, message: Message) -> None:
        self._writing_since = asyncio.get_running_loop().time()
        await send(message)
        self._writing_since = None

    async def _pump(self, send: Send) -> None:
        """The frames that are ready together (the items of one read of the response
        stream) go out as one body message: one socket write, not one per frame."""
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        ready: list[bytes] = []
        arrived, room = asyncio.Event(), asyncio.Event()
        finished = False

        async def read() -> None:
            nonlocal finished
            try:
                async for frame in self.frames:
                    ready.append(frame)
                    arrived.set()
                    while len(ready) >= MAX_READY_FRAMES:  # a slow client holds the reading back
                        room.clear()
                        await room.wait()
            finally:
                finished = True
                arrived.set()

        reader = asyncio.ensure_future(read())
        try:
            while not (finished and not ready):
                await arrived.wait()
                arrived.clear()
                if ready:
                    body = b"".join(ready)
                    ready.clear()
                    room.set()
                    await self._send(send, {"type": "http.response.body", "body": body, "more_body": True})
            await reader  # what made the frames fail, if anything
        finally:
            if not reader.done():
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
        await self._send(send, {"type": "http.response.body", "body": b"", "more_body": False})
