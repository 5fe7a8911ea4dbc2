"""A real gateway for tests: uvicorn on a free loopback port, in a thread with its own loop.

The gateway gets a HookbusClient of its own, made in its thread's event loop, so the test's
loop (which runs the orchestrator and the workers in-process) is never blocked by it and
vice versa.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from hookbus.bus.client import HookbusClient
from hookbus.bus.limits import RequestLimits
from hookbus.services.gateway import create_app
from hookbus.services.gateway.connections import edge_protocol
from hookbus.services.gateway.edge_options import EdgeOptions
from tests.waiting import wait_for


@dataclass
class RunningGateway:
    url: str
    server: uvicorn.Server
    thread: threading.Thread
    app: Any = None
    errors: list[BaseException] = field(default_factory=list)

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"


@contextlib.asynccontextmanager
async def running_gateway(
    redis_url: str,
    prefix: str,
    *,
    api_keys: dict[str, Any] | None = None,
    models: Sequence[str] | None = None,
    limits: RequestLimits | None = None,
    timeout: float = 30.0,
    host: str = "127.0.0.1",
    send_buffer: int | None = None,
    edge: EdgeOptions | None = None,
    **app_options: Any,
) -> AsyncIterator[RunningGateway]:
    """A gateway on a free port of `host` (loopback by default; "0.0.0.0" for every
    address); `app_options` go to create_app. `send_buffer`: the kernel's send buffer of
    every connection (the listening socket's SO_SNDBUF, which accepted ones inherit), small
    to have a client that stops reading fill it at once. `edge`: serve with `hookbus
    gateway`'s own connection handling (header timeout, bound per address:
    hookbus.services.gateway.connections) and its max_connections."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if send_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    holder: dict[str, Any] = {}
    ready = threading.Event()

    async def main() -> None:
        client = HookbusClient(redis_url, prefix=prefix, timeout=timeout)
        try:
            app = create_app(client, api_keys=api_keys, models=models, limits=limits, **app_options)
            at_the_edge: dict[str, Any] = {} if edge is None else {
                "http": edge_protocol(edge.header_timeout, edge.max_connections_per_address),
                "limit_concurrency": edge.max_connections,
            }
            config = uvicorn.Config(
                app, log_config=None, access_log=False, lifespan="on", timeout_graceful_shutdown=5, **at_the_edge
            )
            server = uvicorn.Server(config)
            holder.update(server=server, app=app)
            ready.set()
            await server.serve(sockets=[sock])
        finally:
            ready.set()
            await client.close()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            holder.setdefault("errors", []).append(exc)

    thread = threading.Thread(target=run, name=f"gateway-{port}", daemon=True)
    thread.start()
    await asyncio.to_thread(ready.wait, 10)
    server: uvicorn.Server = holder["server"]

    async def started_or_failed() -> bool:
        return bool(server.started or holder.get("errors"))

    if not await wait_for(started_or_failed, timeout=10, every=0.01) or not server.started:
        raise RuntimeError(f"the gateway did not start: {holder.get('errors')}")
    gateway = RunningGateway(f"http://127.0.0.1:{port}", server, thread, holder["app"])
    try:
        yield gateway
    finally:
        server.should_exit = True
        await asyncio.to_thread(thread.join, 15)
        sock.close()
        gateway.errors.extend(holder.get("errors", []))
