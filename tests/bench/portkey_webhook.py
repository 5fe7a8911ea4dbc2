"""The out-of-process hook on Portkey's side of the gateways bench: the HTTP server its
`default.webhook` guardrail calls, `python -m tests.bench.portkey_webhook PORT`.

Portkey POSTs the request (`request.json`) and the hook's event type to `/check`; the
server masks the bench's word as the hookbus hook does (tests.bench.skills.mask_darn) and
answers `{"verdict": true}` with the rewritten request as `transformedData`, which Portkey
sends on instead of the client's. A small aiohttp server on the loop hookbus's services
get (uvloop), in a process of its own whose CPU the bench counts as Portkey's.
"""

from __future__ import annotations

import asyncio
import json
import sys

from aiohttp import web

from hookbus.services.process import event_loop
from tests.bench.skills import mask_darn


async def check(request: web.Request) -> web.Response:
    body = await request.json(loads=json.loads)
    sent = (body.get("request") or {}).get("json") or {}
    answer: dict[str, object] = {"verdict": True}
    if body.get("eventType") == "beforeRequestHook" and mask_darn(sent.get("messages") or []):
        answer["transformedData"] = {"request": {"json": sent}}
    return web.json_response(answer)


async def ready(_: web.Request) -> web.Response:
    """What the bench waits for before it sends requests."""
    return web.json_response({"ready": True})


async def main(port: int) -> None:
    app = web.Application()
    app.router.add_post("/check", check)
    app.router.add_get("/check", ready)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    event_loop.run(main(int(sys.argv[1])))
