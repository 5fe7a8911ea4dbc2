"""Connections at the edge: slow clients are cut off, and running out of file descriptors
costs one log line per episode, not a traceback per failed accept.

- uvicorn has a keep-alive timeout but no timeout for a request's headers: a client that
  sends one header byte every few seconds (slowloris) holds its connection forever.
  `EdgeHttp` (uvicorn's httptools protocol plus one timer) answers 408 and closes a
  connection whose request headers are not complete `header_timeout` seconds after the
  connection opened or its previous response ended. The body has its own timeout
  (hookbus.services.gateway.request_body).
- A connection closed with data its client does not take (a streamed answer ended because
  its client stopped reading: hookbus.services.gateway.sse) would stay open as long as
  the client wishes, asyncio's close() waiting to flush: `EdgeHttp` aborts it
  when its buffer has not drained `ABORT_AFTER` seconds after the close.
- One client address holds at most `max_connections_per_address` connections at once
  (`EdgeHttp`): one more is answered 503 and closed at once, so a flood from one
  address leaves the rest of `--max-connections` to other callers.
- With every descriptor in use, asyncio reports each failed `accept()` to the loop's
  exception handler, with a traceback, and schedules one retry per failure (up to the
  listen backlog per wake-up), each of which fails again once the server has closed. `AcceptErrorLog` turns them into one warning when
  it starts and one line with the count when accepting works again (or every
  `summary_every` seconds while it lasts), and passes every other error on unchanged.
"""

from __future__ import annotations

import asyncio
import errno
import time
from collections import Counter
from typing import Any

import structlog
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from hookbus.services.gateway.edge_options import HEADER_TIMEOUT

log = structlog.get_logger("hookbus.gateway")

_TIMEOUT_BODY = (
    b'{"error":{"message":"the request headers did not arrive in time",'
    b'"type":"invalid_request_error","code":"request_timeout","param":null}}'
)
_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n" % len(_TIMEOUT_BODY)
) + _TIMEOUT_BODY
_BUSY_BODY = (
    b'{"error":{"message":"too many connections from this address; close some and retry",'
    b'"type":"server_error","code":"too_many_connections","param":null}}'
)
_BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"retry-after: 1\r\ncontent-length: %d\r\n\r\n" % len(_BUSY_BODY)
) + _BUSY_BODY
_ACCEPT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ABORT_AFTER = 1.0
"""Seconds a closed connection may take to hand its client what is left, then it is aborted."""


class _AbortingClose:
    """The connection's transport, whose close() aborts it if what is left to send is not
    taken within ABORT_AFTER seconds (every other call goes to the transport as is)."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        self._transport.close()
        if self._transport.get_write_buffer_size():
            self._loop.call_later(ABORT_AFTER, self._abort_if_stuck)

    def _abort_if_stuck(self) -> None:
        if self._transport.get_write_buffer_size():
            log.info("gateway_connection_aborted", reason="the client took nothing for a second after the close")
            self._transport.abort()


def edge_protocol(header_timeout: float, per_address: int = 0) -> type[EdgeHttp]:
    """uvicorn's `http` protocol class with this header timeout and bound on connections per
    client address (0: none), counted over the connections of this class."""
    return type(
        "EdgeHttp", (EdgeHttp,),
        {"header_timeout": header_timeout, "per_address": per_address, "open_by_address": Counter()},
    )


class EdgeHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol, whose parser is C (llhttp): the gateway spends 2-18 %
    less CPU a request than on h11's pure-Python one (docs/performance.md). A connection's
    header timer runs while no request of it has its headers in and unanswered: from the
    connection's start and from each response's end, unless the next (pipelined)
    request's headers came before it."""

    header_timeout: float = HEADER_TIMEOUT
    per_address: int = 0
    open_by_address: Counter[str] = Counter()
    _header_timer: asyncio.TimerHandle | None = None
    _counted: str | None = None
    _unanswered = 0
    """Requests of this connection whose headers are in and whose responses are not done."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_AbortingClose(transport, self.loop))  # type: ignore[arg-type]
        address = self.client[0] if self.client else None
        if address is not None and self.per_address:
            if self.open_by_address[address] >= self.per_address:
                self.transport.write(_BUSY_RESPONSE)
                self.transport.close()
                return
            self.open_by_address[address] += 1
            self._counted = address
        self._arm()

    def on_headers_complete(self) -> None:
        self._unanswered += 1
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        self._unanswered -= 1
        super().on_response_complete()
        if not self.transport.is_closing() and not self._unanswered:
            self._arm()  # the next request on this connection gets the same time

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._counted is not None:
            self.open_by_address[self._counted] -= 1
            if not self.open_by_address[self._counted]:
                del self.open_by_address[self._counted]
            self._counted = None
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self._unanswered:
            return
        self.transport.write(_TIMEOUT_RESPONSE)
        self.transport.close()


class AcceptErrorLog:
    """A loop exception handler that summarizes accept() failures (see the module doc)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, summary_every: float = 10.0) -> None:
        self._loop = loop
        self._summary_every = summary_every
        self._failures = 0
        self._since = 0.0
        self._last_summary = 0.0
        self._recovery_check: asyncio.TimerHandle | None = None

    def install(self) -> None:
        self._loop.set_exception_handler(self)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        message = str(context.get("message", ""))
        if isinstance(exc, ValueError) and "_start_serving" in message:
            # asyncio schedules one accept retry per failed accept(); those still pending
            # when the server closes find its socket gone: part of the same episode.
            self._failures += 1
            return
        if not (isinstance(exc, OSError) and exc.errno in _ACCEPT_ERRNOS and "accept" in message):
            loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if self._failures == 0:
            self._since = self._last_summary = now
            log.warning(
                "gateway_accept_failing", error=exc.strerror or str(exc),
                message="cannot accept connections (out of file descriptors?): new clients wait; "
                "raise the limit (ulimit -n) or lower --max-connections",
            )
        self._failures += 1
        if now - self._last_summary >= self._summary_every:
            self._last_summary = now
            log.warning("gateway_accept_still_failing", failures=self._failures, seconds=round(now - self._since, 1))
        if self._recovery_check is not None:
            self._recovery_check.cancel()
        # asyncio retries accept() one second after a failure; two quiet seconds mean it works again
        self._recovery_check = loop.call_later(2.5, self._recovered)

    def _recovered(self) -> None:
        log.info(
            "gateway_accept_recovered", failures=self._failures,
            seconds=round(time.monotonic() - self._since, 1),
        )
        self._failures = 0
        self._recovery_check = None
