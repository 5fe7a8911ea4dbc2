"""What an auth-off gateway refuses so that a web page cannot use it through a browser.

Without API keys the gateway trusts whoever reaches its port, and a browser reaches
loopback ports for any page it shows. Two shapes carry such a request, and both are
refused before any route runs:

- a "simple" cross-site POST (`text/plain`, a form): a browser sends it without asking
  the server first; the gateway takes bodies only as `application/json` (415), which a
  browser sends cross-site only after a CORS preflight the gateway never grants;
- DNS rebinding: a page on `evil.example` whose name now resolves to 127.0.0.1 sends
  same-origin requests with `Host: evil.example`; the gateway answers only Host names it
  was told are its own (403): loopback names by default, more with `--allowed-hosts` /
  `$HOOKBUS_ALLOWED_HOSTS` (comma-separated; `*` allows any, for a gateway behind a proxy
  that checks Host itself).

`/healthz` answers any Host (probes address a pod by its IP). With API keys none of this
applies: a page cannot know a key.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from hookbus.services.gateway.edge_options import ALLOWED_HOSTS_ENV
from hookbus.services.gateway.errors import GatewayError, error_response

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})
ANY_HOST_PATHS = frozenset({"/healthz"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def host_name(host_header: str) -> str:
    """The name in a Host header, without its port (`[::1]:8000` -> `::1`)."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def is_loopback(name: str) -> bool:
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class CrossSiteGuard:
    """ASGI middleware for an auth-off gateway: JSON bodies only, known Host names only."""

    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str] = ()) -> None:
        self.app = app
        self.allowed = frozenset(host_name(h) for h in allowed_hosts)

    def host_allowed(self, host_header: str) -> bool:
        name = host_name(host_header)
        return "*" in self.allowed or name in self.allowed or is_loopback(name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                await error_response(refusal, Request(scope))(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> GatewayError | None:
        headers = Headers(scope=scope)
        if scope["path"] not in ANY_HOST_PATHS and not self.host_allowed(headers.get("host", "")):
            return GatewayError(
                403, "host_not_allowed",
                "this gateway runs without API keys and answers only loopback Host names; "
                f"add this one with --allowed-hosts or ${ALLOWED_HOSTS_ENV}",
            )
        if scope["method"] in BODY_METHODS:
            media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
            if media_type != "application/json":
                return GatewayError(
                    415, "unsupported_media_type",
                    "send the body as Content-Type: application/json",
                )
        return None
