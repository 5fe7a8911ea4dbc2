"""`hookbus console`: the console on its own port, for a deployment that runs no gateway.

The same routes as the gateway's `/console/` (hookbus.services.console.routes) and the
same keys (`--api-keys FILE` or $HOOKBUS_API_KEYS; only a key with the admin scope sees
data). Without keys it answers only loopback clients and Host names, like an auth-off
gateway (hookbus.services.gateway.cross_site).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import redis.asyncio as aredis
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from hookbus.bus.keys import Keys
from hookbus.services.console import CONSOLE_PATH
from hookbus.services.console.routes import attach_console, console_mount
from hookbus.services.gateway.auth import ApiKey, Authenticator, normalize_keys
from hookbus.services.gateway.cross_site import CrossSiteGuard
from hookbus.services.gateway.errors import ERROR_HANDLERS


def create_console_app(
    client: aredis.Redis,
    keys: Keys,
    *,
    api_keys: Mapping[str, ApiKey | dict[str, Any]] | None,
    allowed_hosts: Sequence[str] = (),
) -> Starlette:
    """The console alone; `api_keys=None` is auth off (loopback only). `client` is not
    closed by the app."""
    normalized = normalize_keys(None if api_keys is None else dict(api_keys))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await app.state.console.data.stop()

    app = Starlette(
        routes=[Route("/", to_console, methods=["GET"]), console_mount()],
        middleware=[Middleware(CrossSiteGuard, allowed_hosts=allowed_hosts)] if normalized is None else [],
        exception_handlers=dict(ERROR_HANDLERS),
        lifespan=lifespan,
    )
    attach_console(app, client, keys, Authenticator(normalized))
    return app


async def to_console(request: Request) -> Response:
    return RedirectResponse(CONSOLE_PATH)


def serve_console(host: str, port: int, api_keys: dict[str, ApiKey] | None, redis_url: str, prefix: str) -> None:
    """Run the console in the foreground until SIGINT or SIGTERM."""
    from hookbus.bus.connection.cluster import keys_for
    from hookbus.bus.connection.retrying import connect

    if api_keys is None:
        print(
            f"hookbus console: AUTH IS OFF: only clients on this machine are answered. "
            f"Open http://{host}:{port}{CONSOLE_PATH}", file=sys.stderr, flush=True,
        )
    client = connect(redis_url, retries=0)
    app = create_console_app(client, keys_for(redis_url, prefix), api_keys=api_keys)
    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, lifespan="on")
    print(f"hookbus console: http://{host}:{port}{CONSOLE_PATH}", flush=True)
    uvicorn.Server(config).run()
