"""Who may see the console: with API keys, only a key holding ADMIN_SCOPE; without, only
a client on a loopback address.

A browser cannot put a bearer key on the request that loads a page, so the page and its
scripts hold no data and load for anyone allowed to reach them; the page asks for the key,
keeps it in the tab's sessionStorage and sends it as `Authorization: Bearer` on every data
call, the live stream included (a streamed fetch, not EventSource, which cannot send
headers). No cookie is set, so another site's page cannot make a browser act with it.
"""

from __future__ import annotations

from starlette.requests import Request

from hookbus.services.gateway.auth import Authenticator
from hookbus.services.gateway.cross_site import is_loopback
from hookbus.services.gateway.errors import GatewayError

ADMIN_SCOPE = "hookbus:admin"


def require_loopback_when_open(authenticate: Authenticator, request: Request) -> None:
    """With auth off, a client that is not on this machine is refused (403)."""
    if authenticate.enabled:
        return
    client = request.client
    if client is None or not is_loopback(client.host):
        raise GatewayError(
            403, "console_loopback_only",
            "this console runs without API keys and answers only clients on this machine; "
            f"give the gateway keys and use one with the {ADMIN_SCOPE!r} scope",
        )


def require_admin(authenticate: Authenticator, request: Request) -> None:
    """The data routes' check: 401 without a valid key, 403 for a key without ADMIN_SCOPE;
    with auth off, the loopback rule."""
    require_loopback_when_open(authenticate, request)
    if not authenticate.enabled:
        return
    auth = authenticate(request)
    if ADMIN_SCOPE not in auth.scopes:
        raise GatewayError(403, "console_admin_only", f"the console needs a key with the {ADMIN_SCOPE!r} scope")
