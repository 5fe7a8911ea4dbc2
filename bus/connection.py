"""Redis clients that survive a Redis restart: retries with backoff on connection errors."""

from __future__ import annotations

import os
import socket

import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import BusyLoadingError, ConnectionError, ResponseError, TimeoutError

RECONNECT_ERRORS = (ConnectionError, TimeoutError, BusyLoadingError, OSError)


def connect(url: str, *, max_connections: int = 200, retries: int = 12) -> aredis.Redis:
    """A pooled async client; commands retry through a short outage (about 10 s).

    Long blocking reads use `retries=0` and reconnect in their own loop: redis-py's
    retry would otherwise swallow the cancellation that stops them.
    """
    return aredis.Redis.from_url(
        url,
        max_connections=max_connections,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=retries),
        retry_on_error=[ConnectionError, TimeoutError, BusyLoadingError] if retries else [],
        health_check_interval=15,
        socket_keepalive=True,
        socket_connect_timeout=2,
        socket_timeout=10,  # blocking reads here block for at most 2 s
    )


def instance_name(role: str) -> str:
    """Unique per process: host + pid (+ role), as consumer and reply-stream names."""
    return f"{role}-{socket.gethostname()}-{os.getpid()}"


async def ensure_group(client: aredis.Redis, stream: str, group: str) -> None:
    """Create `group` on `stream` from its first entry (the stream too, if missing)."""
    try:
        await client.xgroup_create(stream, group, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
