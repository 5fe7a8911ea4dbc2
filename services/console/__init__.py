"""The web console: the bus, its requests (each one's waterfall) and its dead letters, in a page.

Served by the gateway at `/console/` and by `hookbus console` (hookbus.services.console.app)
without one. One poller per process reads Redis in bounded batches and every viewer of
that process shares what it read (hookbus.services.console.data); the routes
(hookbus.services.console.routes) answer only an admin key, or with auth off only a
loopback client (hookbus.services.console.access). The page is plain HTML, JS and CSS
shipped in the package (static/): no build step.
"""

from __future__ import annotations

CONSOLE_PATH = "/console/"


def request_link(completion_id: str, base_url: str = "") -> str:
    """Where the console shows one request's waterfall (a path when `base_url` is empty)."""
    return f"{base_url.rstrip('/')}{CONSOLE_PATH}#/requests/{completion_id}"
