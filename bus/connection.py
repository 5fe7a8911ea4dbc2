"""Redis clients that survive a Redis restart: retries with backoff on connection errors."""

from __future__ import annotations

import os
import socket
from typing import Any

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


def broker_retry() -> dict[str, Any]:
    """Connection options for a FastStream RedisBroker so its client (consumer reads,
    acks, replies) rides out a short Redis outage like `connect`'s clients do. Longer
    outages surface to FastStream's subscriber, which logs "Message fetch error" and
    reads again after a few seconds."""
    return {
        "retry": Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=12),
        "retry_on_error": [ConnectionError, TimeoutError, BusyLoadingError],
    }


async def raw_entry_parser(message, original):  # type: ignore[no-untyped-def]
    """A FastStream `parser=` for hookbus streams: the handlers read the raw entry
    (`msg.raw_message["data"]`) and decode it as an envelope themselves, so FastStream
    is given an empty body. Its own parser would JSON-dump the raw fields first, which
    costs time on every entry and fails on bytes that are not UTF-8 (the entry would
    then never reach the handler, so it could not be dead-lettered)."""
    parsed = await original({**message, "data": {}})
    parsed.raw_message = message
    return parsed
