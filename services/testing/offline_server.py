"""Serve the offline model over real HTTP on loopback, from a background thread.

The agent reaches the offline model through the same ``openai.AsyncOpenAI`` code path as any
real endpoint, so the model needs a real socket. ``OfflineModelServer`` runs uvicorn in a
daemon thread with its own event loop: it serves callers on any event loop (or none), and
outlives the loops of ``asyncio.run`` calls that come and go. ``shared_offline_base_url()``
gives the whole process one such server, started on first use.

Any API key works against it; ``OFFLINE_API_KEY`` is a placeholder for clients that insist
on one. Each server records every HTTP request it receives (``received``: method, path, body),
so a test can assert that nothing reached the model that should not have.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import threading
import time
from types import TracebackType

import structlog
import uvicorn
from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hookbus.services.testing.offline_model import create_app

log = structlog.get_logger("hookbus.offline_model")

__all__ = ["OFFLINE_API_KEY", "OfflineModelServer", "ReceivedRequest", "shared_offline_base_url"]

OFFLINE_API_KEY = "offline"
_HOST = "127.0.0.1"


class ReceivedRequest(BaseModel):
    """One HTTP request as the server received it; `body` is its JSON (None if it had none)."""

    method: str
    path: str
    body: object = None


class _Recording:
    """ASGI middleware appending every request to `received` as it arrives; its body is
    filled in once the app has read it (a handler that never reads it leaves None)."""

    def __init__(self, app: ASGIApp, received: list[ReceivedRequest]) -> None:
        self.app, self.received = app, received

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        entry = ReceivedRequest(method=scope["method"], path=scope["path"])
        self.received.append(entry)
        parts: list[bytes] = []

        async def recorded() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                parts.append(message.get("body", b""))
                if not message.get("more_body"):
                    entry.body = _json_or_text(b"".join(parts))
            return message

        await self.app(scope, recorded, send)


def _json_or_text(raw: bytes) -> object:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


class _ReadyServer(uvicorn.Server):
    """A uvicorn server that says when its socket is listening, so ``start`` need not poll."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self.ready.set()


class OfflineModelServer:
    """The offline model on ``http://127.0.0.1:<port>/v1``, served by uvicorn in a daemon thread.

    ``port=0`` (the default) lets the OS pick a free port, so any number of servers (one per
    test, say) can run side by side. ``start()`` returns once the socket accepts connections.
    """

    def __init__(self, port: int = 0, *, startup_timeout: float = 5.0) -> None:
        self._port = port
        self._startup_timeout = startup_timeout
        self._lock = threading.Lock()
        self._server: _ReadyServer | None = None
        self._thread: threading.Thread | None = None
        self._base_url: str | None = None
        self.received: list[ReceivedRequest] = []
        """Every HTTP request served, in arrival order."""

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``, what ``OPENAI_BASE_URL`` would be; only while running."""
        if self._base_url is None or not self.running:
            raise RuntimeError("the offline model server is not running; call start() first")
        return self._base_url

    def start(self) -> str:
        """Start serving (a no-op when already running) and return the base url."""
        with self._lock:
            if self.running and self._base_url is not None:
                return self._base_url
            config = uvicorn.Config(
                _Recording(create_app(), self.received),
                host=_HOST,
                port=self._port,
                loop="asyncio",
                lifespan="off",
                access_log=False,
                log_config=None,  # leave the process's logging setup alone
                log_level="warning",
                timeout_graceful_shutdown=1,
            )
            server = _ReadyServer(config)
            thread = threading.Thread(target=server.run, name="hookbus-offline-model", daemon=True)
            thread.start()
            self._wait_ready(server, thread)
            port = server.servers[0].sockets[0].getsockname()[1]
            self._server, self._thread = server, thread
            self._base_url = f"http://{_HOST}:{port}/v1"
            return self._base_url

    def _wait_ready(self, server: _ReadyServer, thread: threading.Thread) -> None:
        deadline = time.monotonic() + self._startup_timeout
        while not server.ready.wait(0.005):
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                raise RuntimeError(
                    f"the offline model server did not start on {_HOST}:{self._port}"
                )

    def stop(self, timeout: float = 5.0, *, force: bool = False) -> None:
        """Stop serving and wait for the thread; open streams are cut after about a second.

        `force` drops idle keep-alive connections at once (the process is exiting).
        """
        with self._lock:
            server, thread = self._server, self._thread
            self._server = self._thread = self._base_url = None
        if server is None or thread is None:
            return
        if force:  # requests still sleeping in the model are cut; that is no error to report
            logging.getLogger("uvicorn.error").disabled = True
        server.should_exit = True
        server.force_exit = force
        thread.join(timeout)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout)

    def __enter__(self) -> OfflineModelServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


_shared_lock = threading.Lock()
_shared: OfflineModelServer | None = None
_shared_pid: int | None = None


def shared_offline_base_url() -> str:
    """Base url of the process-wide offline model server, starting it on first use.

    Thread-safe, and safe to call from any event loop: the server lives in its own thread.
    The first call blocks for the start-up (tens of milliseconds). A forked child gets its own
    server, since threads do not survive a fork.
    """
    global _shared, _shared_pid
    with _shared_lock:
        if _shared is None or _shared_pid != os.getpid() or not _shared.running:
            if _shared is None:
                atexit.register(_stop_shared)
            server = OfflineModelServer()
            server.start()
            _shared, _shared_pid = server, os.getpid()
            log.warning(  # the one line that says answers come from a stand-in, not a model
                "offline_model_in_use", base_url=server.base_url,
                message="no OPENAI_BASE_URL set: answers come from hookbus's built-in offline "
                "model, a deterministic stand-in for tests and demos (not an AI)",
            )
        return _shared.base_url


def _stop_shared() -> None:
    with _shared_lock:
        if _shared is not None and _shared_pid == os.getpid():
            _shared.stop(timeout=2.0, force=True)
