"""The options of a gateway's edge (hookbus.services.gateway): timeouts for slow clients, a
bound on connections, the Host names an auth-off gateway answers. `hookbus gateway` has
one option per field; this module imports nothing of the gateway, so the CLI stays light."""

from __future__ import annotations

import os

from pydantic import BaseModel, Field

HEADER_TIMEOUT = 10.0
BODY_TIMEOUT = 60.0
MAX_CONNECTIONS = 1000
MAX_CONNECTIONS_PER_ADDRESS = 100
STALL_TIMEOUT = 15.0
ALLOWED_HOSTS_ENV = "HOOKBUS_ALLOWED_HOSTS"


def allowed_hosts_from_env() -> list[str]:
    return [h.strip() for h in os.environ.get(ALLOWED_HOSTS_ENV, "").split(",") if h.strip()]


class EdgeOptions(BaseModel):
    """How the gateway treats connections and callers at its edge."""

    header_timeout: float = Field(
        default=HEADER_TIMEOUT, gt=0, description="Seconds a client has to send a request's headers."
    )
    body_timeout: float = Field(
        default=BODY_TIMEOUT, gt=0, description="Seconds a client has to send a request's body."
    )
    stall_timeout: float = Field(
        default=STALL_TIMEOUT, gt=0,
        description="Seconds a streamed answer may wait for its client to take a write (at most the "
        "request deadline); then the response ends, its run is cancelled (499 client_stalled), its "
        "slot freed and its response stream deleted.",
    )
    max_connections: int = Field(
        default=MAX_CONNECTIONS, gt=0, description="Connections served at once; beyond them a request gets 503."
    )
    max_connections_per_address: int = Field(
        default=MAX_CONNECTIONS_PER_ADDRESS, ge=0,
        description="Connections one client address may hold at once; beyond them a connection gets "
        "503 and is closed (0: no bound; behind a proxy every client has the proxy's address).",
    )
    allowed_hosts: list[str] = Field(
        default_factory=allowed_hosts_from_env,
        description=f"Host names an auth-off gateway answers besides loopback ones (${ALLOWED_HOSTS_ENV}); `*`: any.",
    )
