"""Redis clients that survive a Redis restart: retries with backoff on connection errors."""

from __future__ import annotations

import os
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import redis.asyncio as aredis
from redis._parsers.base import BaseParser
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterError,
    ConnectionError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    TimeoutError,
    TryAgainError,
)

from hookbus.bus.connection.cluster import cluster_client, is_cluster

if TYPE_CHECKING:
    from faststream.redis import RedisBroker



class UnblockedError(ResponseError):
    """`UNBLOCKED`: a blocking read cut off because its node stopped being a master (a
    failover demoted it). redis-py has no class of its own for it: registered below, a
    subclass of ResponseError, so code that catches ResponseError sees no change."""


BaseParser.EXCEPTION_CLASSES.setdefault("UNBLOCKED", UnblockedError)

CLUSTER_TRANSIENT_ERRORS = (
    ClusterError, AskError, TryAgainError, ReadOnlyError, RedisClusterException, UnblockedError,
)
"""What a cluster client raises when its own retries did not outlast a failover or a
slot migration (CLUSTERDOWN, MOVED/ASK/TRYAGAIN still bouncing, a demoted master's
READONLY, no reachable node): the same treatment as a dropped connection."""
RECONNECT_ERRORS = (ConnectionError, TimeoutError, BusyLoadingError, OSError, *CLUSTER_TRANSIENT_ERRORS)


def connect(
    url: str, *, max_connections: int = 200, retries: int = 12, socket_timeout: float = 10
) -> aredis.Redis:
    """A pooled async client; commands retry through a short outage (about 10 s).

    Long blocking reads use `retries=0` and reconnect in their own loop: redis-py's
    retry would otherwise swallow the cancellation that stops them.

    On a Redis Cluster (hookbus.bus.connection.cluster) this is a `RedisCluster`, typed as a
    `Redis`: hookbus only uses commands both have, with keys laid out per slot."""
    options: dict[str, Any] = {
        "max_connections": max_connections,
        "retry": Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=retries),
        "retry_on_error": [ConnectionError, TimeoutError, BusyLoadingError] if retries else [],
        "health_check_interval": 15,
        "socket_keepalive": True,
        "socket_connect_timeout": min(2, socket_timeout),
        "socket_timeout": socket_timeout,  # blocking reads here block for at most 2 s
    }
    if is_cluster(url):
        return cluster_client(url, **options)  # type: ignore[return-value]
    return aredis.Redis.from_url(url, **options)


def out_of_memory(exc: BaseException) -> bool:
    """Redis refused a write at `maxmemory` (policy noeviction): "OOM command not allowed",
    as a command's own error or, from a Lua script (Redis 6.2: "Error running script ...
    -OOM command not allowed"), inside a plain ResponseError."""
    return isinstance(exc, OutOfMemoryError) or (
        isinstance(exc, ResponseError) and "-OOM command not allowed" in str(exc)
    )


def retryable(exc: BaseException) -> bool:
    """Redis unreachable for now, or refusing writes for want of memory: worth another try."""
    return isinstance(exc, RECONNECT_ERRORS) or out_of_memory(exc)


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


def broker_class(url: str) -> type[RedisBroker]:
    """FastStream's broker for the Redis at `url`: its `RedisClusterBroker` on a cluster,
    with hookbus's cluster connections (hookbus.bus.connection.cluster_broker)."""
    from faststream.redis import RedisBroker

    from hookbus.bus.connection.cluster_broker import ClusterBroker

    return ClusterBroker if is_cluster(url) else RedisBroker


def broker_retry() -> dict[str, Any]:
    """Connection options for a FastStream RedisBroker so its client (consumer reads,
    acks, replies) rides out a short Redis outage like `connect`'s clients do. Longer
    outages surface to FastStream's subscriber, which logs "Message fetch error" and
    reads again after a few seconds."""
    return {
        "retry": Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=12),
        "retry_on_error": [ConnectionError, TimeoutError, BusyLoadingError],
    }


async def raw_entry_parser(message: dict[str, Any], original: Callable[[Any], Awaitable[Any]]) -> Any:
    """A FastStream `parser=` for hookbus streams: the handlers read the raw entry
    (`msg.raw_message["data"]`) and decode it as an envelope themselves, so FastStream
    is given an empty body. Its own parser would JSON-dump the raw fields first, which
    costs time on every entry and fails on bytes that are not UTF-8 (the entry would
    then never reach the handler, so it could not be dead-lettered)."""
    parsed = await original({**message, "data": {}})
    parsed.raw_message = message
    return parsed
