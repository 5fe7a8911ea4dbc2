"""The console's HTTP routes, mounted at `/console` by the gateway and by `hookbus console`.

    GET  /console/                                   the page (static, no data)
    GET  /console/static/{name}                      its script and style sheet
    GET  /console/api/live                           server-sent events: a Snapshot after each poll
    GET  /console/api/bus                            the latest BusView
    GET  /console/api/requests?outcome=&group=&caller=&agent=&limit=   kept requests, newest first
    GET  /console/api/requests/{completion_id}       one request's Waterfall
    GET  /console/api/dead-letters                   the newest dead letters
    GET  /console/api/dead-letters/{id}?content=1    one dead letter and its original
    POST /console/api/dead-letters/{id}/requeue      its original back onto its stream
    DELETE /console/api/dead-letters/{id}

Every data route needs an admin key (hookbus.services.console.access); the app that mounts
them puts a `Console` in `app.state.console`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import redis.asyncio as aredis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

from hookbus.bus.keys import Keys
from hookbus.services.console import dead_letters
from hookbus.services.console.access import require_admin, require_loopback_when_open
from hookbus.services.console.data import KEPT_REQUESTS, LIVE_REQUESTS, ConsoleData
from hookbus.services.gateway.auth import Authenticator
from hookbus.services.gateway.errors import GatewayError
from hookbus.services.gateway.sse import SSE_HEADERS

STATIC_DIR = Path(__file__).parent / "static"
STATIC_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}


@dataclass
class Console:
    """What the console's routes share (one per app, in `app.state.console`)."""

    data: ConsoleData
    authenticate: Authenticator
    client: aredis.Redis
    keys: Keys


def attach_console(app: Starlette, client: aredis.Redis, keys: Keys, authenticate: Authenticator) -> None:
    """Give `app` (which mounts `console_mount()`) its console state; its lifespan stops
    `app.state.console.data` when the app stops."""
    app.state.console = Console(data=ConsoleData(client, keys), authenticate=authenticate, client=client, keys=keys)


def console_of(request: Request) -> Console:
    return request.app.state.console


def admin_console(request: Request) -> Console:
    console = console_of(request)
    require_admin(console.authenticate, request)
    return console


async def index(request: Request) -> Response:
    require_loopback_when_open(console_of(request).authenticate, request)
    return _static("index.html")


async def static_file(request: Request) -> Response:
    require_loopback_when_open(console_of(request).authenticate, request)
    name = request.path_params["name"]
    if name == "index.html" or name not in {p.name for p in STATIC_DIR.iterdir()}:
        raise GatewayError(404, "not_found", f"no console file {name!r}")
    return _static(name)


PAGE_HEADERS = {
    "cache-control": "no-cache",
    # its own scripts only, and never inside another site's frame (its buttons requeue and delete)
    "content-security-policy": "default-src 'self'; frame-ancestors 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
}


def _static(name: str) -> Response:
    path = STATIC_DIR / name
    return FileResponse(path, media_type=STATIC_TYPES.get(path.suffix), headers=PAGE_HEADERS)


LIVE_STREAM_SECONDS = 15.0
"""A live stream ends after this long and the page opens the next one at once: a stopping
server, which waits for open responses, never waits long for a console tab."""


async def live(request: Request) -> Response:
    """One frame per poll for LIVE_STREAM_SECONDS (the poller runs meanwhile)."""
    data = admin_console(request).data
    ends = time.monotonic() + LIVE_STREAM_SECONDS

    async def frames() -> AsyncIterator[bytes]:
        snapshot = await data.snapshot()
        while True:
            yield data.live_frame(snapshot)
            if time.monotonic() >= ends:
                return
            snapshot = await data.next_snapshot(snapshot)

    return StreamingResponse(frames(), headers={k.decode(): v.decode() for k, v in SSE_HEADERS})


async def bus(request: Request) -> Response:
    data = admin_console(request).data
    return JSONResponse((await data.snapshot()).bus.model_dump(mode="json"))


async def requests(request: Request) -> Response:
    data = admin_console(request).data
    await data.snapshot()
    query = request.query_params
    found = data.requests(
        outcome=query.get("outcome"), group=query.get("group"), caller=query.get("caller"), agent=query.get("agent")
    )
    return JSONResponse([view.model_dump(mode="json") for view in found[: _limit(query.get("limit"))]])


LIMIT_DIGITS = 9
"""A longer `limit` is refused before it becomes a number (Python's int() refuses past
4,300 digits; a list never holds more than KEPT_REQUESTS anyway)."""


def _limit(given: str | None) -> int:
    """How many requests a list answers: `limit`, LIVE_REQUESTS by default, at most KEPT_REQUESTS.
    Only the digits 0-9 count as digits (`isdigit` alone takes "²", which int() refuses)."""
    if not given:
        return LIVE_REQUESTS
    if not (given.isascii() and given.isdigit()) or len(given) > LIMIT_DIGITS:
        shown = given if len(given) <= 20 else f"{given[:20]}... ({len(given):,} characters)"
        raise GatewayError(
            400, "invalid_limit",
            f"limit must be a whole number written with 0-9, at most {LIMIT_DIGITS} digits "
            f"(the list holds at most {KEPT_REQUESTS:,}), got {shown!r}",
            param="limit",
        )
    return min(int(given), KEPT_REQUESTS)


async def waterfall(request: Request) -> Response:
    data = admin_console(request).data
    await data.snapshot()
    completion_id = request.path_params["completion_id"]
    found = data.waterfall(completion_id)
    if found is None:
        raise GatewayError(
            404, "request_not_found",
            f"no events of {completion_id!r} among the requests this console keeps (the newest ones)",
        )
    return JSONResponse(found.model_dump(mode="json"))


async def list_dead_letters(request: Request) -> Response:
    data = admin_console(request).data
    return JSONResponse([letter.model_dump(mode="json") for letter in (await data.snapshot()).dead_letters])


async def _letter(request: Request) -> tuple[Console, dead_letters.DeadLetterView]:
    console = admin_console(request)
    letter_id = request.path_params["letter_id"]
    letter = await dead_letters.dead_letter(console.client, console.keys, letter_id)
    if letter is None:
        raise GatewayError(404, "dead_letter_not_found", f"no dead letter {letter_id!r}")
    return console, letter


async def inspect_dead_letter(request: Request) -> Response:
    console, letter = await _letter(request)
    content = request.query_params.get("content") in ("1", "true")
    detail = await dead_letters.inspect(console.client, console.keys, letter, content=content)
    return JSONResponse(detail.model_dump(mode="json"))


async def requeue_dead_letter(request: Request) -> Response:
    console, letter = await _letter(request)
    requeued = await dead_letters.requeue(console.client, console.keys, letter)
    if requeued is None:
        raise GatewayError(
            409, "original_gone", "the original entry is no longer kept (expired or too large): it cannot be requeued"
        )
    await console.data.refresh_now()
    return JSONResponse(requeued.model_dump(mode="json"))


async def delete_dead_letter(request: Request) -> Response:
    console, letter = await _letter(request)
    await dead_letters.delete(console.client, console.keys, letter)
    await console.data.refresh_now()
    return Response(status_code=204)


def console_mount() -> Mount:
    return Mount(
        "/console",
        routes=[
            Route("/", index, methods=["GET"]),
            Route("/static/{name}", static_file, methods=["GET"]),
            Route("/api/live", live, methods=["GET"]),
            Route("/api/bus", bus, methods=["GET"]),
            Route("/api/requests", requests, methods=["GET"]),
            Route("/api/requests/{completion_id}", waterfall, methods=["GET"]),
            Route("/api/dead-letters", list_dead_letters, methods=["GET"]),
            Route("/api/dead-letters/{letter_id}", inspect_dead_letter, methods=["GET"]),
            Route("/api/dead-letters/{letter_id}/requeue", requeue_dead_letter, methods=["POST"]),
            Route("/api/dead-letters/{letter_id}", delete_dead_letter, methods=["DELETE"]),
        ],
    )
