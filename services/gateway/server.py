"""`hookbus gateway`: serve the app with uvicorn until SIGTERM or SIGINT.

On SIGTERM or SIGINT uvicorn stops accepting connections and gives open requests
(streams included) up to GRACEFUL_SECONDS to end; a stream still open after that is cut,
and its request is cancelled like a client disconnect (reason `gateway_stopped`). The
process then exits normally (status 0); a second SIGINT forces the exit.

At the edge (`EdgeOptions`, each a `hookbus gateway` option): a client has
`header_timeout` seconds for a request's headers and `body_timeout` for its body (then
408), at most `max_connections` connections are served at once (beyond them uvicorn
answers 503), and running out of file descriptors is logged once per episode
(hookbus.services.gateway.connections). Without API keys the gateway says so on stderr
and answers only loopback Host names plus `allowed_hosts`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

import structlog
import uvicorn
from prometheus_client import disable_created_metrics

from hookbus.bus.client import HookbusClient
from hookbus.bus.limits import RequestLimits
from hookbus.services.gateway.app import create_app
from hookbus.services.gateway.auth import load_api_keys
from hookbus.services.gateway.connections import AcceptErrorLog, edge_protocol
from hookbus.services.gateway.edge_options import EdgeOptions

log = structlog.get_logger("hookbus.gateway")

GRACEFUL_SECONDS = 30
AUTH_OFF_WARNING = (
    "hookbus gateway: AUTH IS OFF. Anyone who can reach {where} can use the agent, and all "
    "callers share one identity. Pass --api-keys FILE or set HOOKBUS_API_KEYS."
)


def serve(
    host: str,
    port: int,
    api_keys_file: str | None,
    redis_url: str,
    prefix: str,
    *,
    models: list[str] | None = None,
    limits: RequestLimits | None = None,
    edge: EdgeOptions | None = None,
) -> None:
    """Run a gateway in the foreground; returns after a graceful shutdown.

    Keys come from `api_keys_file`, else $HOOKBUS_API_KEYS, else auth is off (said on
    stderr). A keys file that cannot be read, parses wrong or holds a key that must not
    be used (hookbus.services.gateway.auth) raises ValueError/OSError before anything
    starts.
    """
    api_keys = load_api_keys(api_keys_file)
    if api_keys is None:
        print(AUTH_OFF_WARNING.format(where=f"{host}:{port}"), file=sys.stderr, flush=True)
    disable_created_metrics()  # no `_created` series: they double /metrics for nothing
    asyncio.run(  # the stock loop: AcceptErrorLog relies on how it retries a failed accept()
        _serve(host, port, api_keys, redis_url, prefix, models=models, limits=limits, edge=edge or EdgeOptions())
    )


async def _serve(
    host: str,
    port: int,
    api_keys: dict | None,
    redis_url: str,
    prefix: str,
    *,
    models: list[str] | None,
    limits: RequestLimits | None,
    edge: EdgeOptions,
) -> None:
    AcceptErrorLog(asyncio.get_running_loop()).install()
    client = HookbusClient(redis_url, prefix=prefix, limits=limits)
    try:
        app = create_app(
            client, api_keys=api_keys, models=models, limits=limits, body_timeout=edge.body_timeout,
            allowed_hosts=edge.allowed_hosts, stall_timeout=edge.stall_timeout,
        )
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=GRACEFUL_SECONDS,
            proxy_headers=True,
            http=edge_protocol(edge.header_timeout, edge.max_connections_per_address),
            limit_concurrency=edge.max_connections,
        )
        log.info("gateway_listening", host=host, port=port, url=f"http://{host}:{port}/v1")
        await _Server(config).serve()
    finally:
        await client.close()


class _Server(uvicorn.Server):
    """uvicorn, minus re-raising the signal after a graceful stop (so the exit status is 0)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        loop = asyncio.get_running_loop()
        signals = (signal.SIGINT, signal.SIGTERM)
        for sig in signals:
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            yield
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: int) -> None:
        log.info("gateway_stopping", signal=signal.Signals(sig).name)
        self.handle_exit(sig, None)
