"""Redis Cluster support: detecting a cluster behind REDIS_URL and building its clients.

`REDIS_URL` may name a single Redis/Valkey or any node of a cluster. The first client
built for a URL asks the server once (`INFO cluster`, `cluster_enabled:1`) and the answer
is kept for the process. On a cluster:

- clients are redis-py's asyncio `RedisCluster`: it learns the slot map from the node in
  the URL, follows MOVED and ASK redirections (slot migration), and after a failover
  (connection refused, CLUSTERDOWN, a demoted master's READONLY) reloads the map and
  retries with backoff; what still fails after that is one of
  hookbus.bus.connection.retrying.RECONNECT_ERRORS, which every read loop answers with backoff;
  a connection that such a reload closed under a command is one of those too
  (`ToleratingConnection`), on every client, FastStream's included;
- the FastStream broker is its `RedisClusterBroker` (hookbus.bus.connection.cluster_broker);
- keys are hash-tagged and sharded (hookbus.bus.keys, hookbus.bus.connection.shards);
- a pipeline over keys of several slots runs one batch per node, concurrently, so two
  steps that must happen in order ("reply, then ack") go in two round trips
  (`in_order`); on a single Redis they stay one pipelined round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import redis
import redis.asyncio as aredis
import structlog
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import Connection, SSLConnection
from redis.exceptions import ConnectionError as RedisConnectionError

from hookbus.bus.connection.shards import DEFAULT_CLUSTER_SHARDS
from hookbus.bus.keys import Keys
from hookbus.bus.settings import get_settings

log = structlog.get_logger("hookbus.cluster")

_cluster_mode: dict[str, bool] = {}


def is_cluster(url: str) -> bool:
    """Whether the server at `url` runs in cluster mode (asked once per URL and process).

    An unreachable server is taken for a single Redis without remembering it, so the
    next client built once it is back asks again."""
    known = _cluster_mode.get(url)
    if known is not None:
        return known
    probe = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        enabled = int(probe.info("cluster").get("cluster_enabled", 0)) == 1
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        log.warning("cluster_detection_failed", error=str(exc), assumed="single redis")
        return False
    except redis.ResponseError:  # INFO renamed or forbidden: no way to tell, assume single
        enabled = False
    finally:
        probe.close()
    _cluster_mode[url] = enabled
    if enabled:
        log.info("redis_cluster_detected", url=_without_password(url))
    return enabled


def declare_mode(url: str, *, cluster: bool) -> None:
    """Say what `url` is without asking it (for services built only to be described, as
    the AsyncAPI document does, whose URL names no server)."""
    _cluster_mode[url] = cluster


def is_cluster_client(client: Any) -> bool:
    return isinstance(client, RedisCluster)


def keys_for(url: str, prefix: str, *, shards: int | None = None) -> Keys:
    """The key layout for the Redis at `url`: plain names on a single Redis, hash-tagged
    and `HOOKBUS_SHARDS`-way sharded (default 12) on a cluster."""
    cluster = is_cluster(url)
    count = shards or get_settings().shards or (DEFAULT_CLUSTER_SHARDS if cluster else 1)
    if cluster and "{" in prefix:
        log.warning(
            "prefix_hash_tag_on_cluster", prefix=prefix,
            hint="a hash tag in HOOKBUS_PREFIX puts every key in one slot (one node); drop the braces",
        )
    return Keys(prefix, shards=count, cluster=cluster)


def _closed(exc: AttributeError) -> RedisConnectionError:
    # exactly ConnectionError: the cluster client retries only errors of the listed types
    return RedisConnectionError(f"connection closed under the command by another task: {exc}")


class ToleratingConnection(Connection):
    """redis-py's asyncio connection, for a cluster whose slot map changes under load.

    When a slot migrates or a master fails over, redis-py (8.1) reloads its map and
    closes connections that other tasks of the same client hold (`aclose()` on
    CLUSTERDOWN and on every retried pipeline, `disconnect_free_connections()` racing a
    task that just took one). The task that held it then writes to or reads from a
    stream of None: an AttributeError, which no retry of redis-py's covers, so the
    command is lost (seen as requests that never got finalize_connection in the
    failover test). Here that failure is what it is, a closed connection: single
    commands, scripts, pipelines and blocking reads alike see a ConnectionError, which
    the cluster client retries after reloading the map (and a `retries=0` reader's own
    loop backs off on)."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        try:
            await super().send_packed_command(command, check_health)
        except AttributeError as exc:  # redis-py already disconnected it (as on any error)
            raise _closed(exc) from exc

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except AttributeError as exc:
            raise _closed(exc) from exc


class ToleratingSSLConnection(ToleratingConnection, SSLConnection):
    """The same over TLS (`rediss://`)."""


def tolerate_closed_connections(client: RedisCluster) -> RedisCluster:
    """Make `client`'s nodes, those it knows and those it will learn, open
    ToleratingConnections. RedisCluster takes no connection class; redis-py itself
    injects per-connection options this way after construction (maintenance
    notifications). Call before the first command: connections already made keep their
    class."""
    options = client.nodes_manager.connection_kwargs
    tls = issubclass(options.get("connection_class", Connection), SSLConnection)
    tolerating = ToleratingSSLConnection if tls else ToleratingConnection
    options["connection_class"] = tolerating
    for node in (*client.nodes_manager.startup_nodes.values(), *client.nodes_manager.nodes_cache.values()):
        node.connection_class = tolerating
    return client


def cluster_client(url: str, *, max_connections: int, retry: Any, retry_on_error: list[type[Exception]], **options: Any) -> RedisCluster:
    """A `RedisCluster` with the same retry and timeout options as single-Redis clients
    (`max_connections` is per node)."""
    return tolerate_closed_connections(RedisCluster.from_url(
        url,
        max_connections=max_connections,
        retry=retry,
        retry_on_error=retry_on_error,
        require_full_coverage=False,  # a slot without a master fails alone, not every command
        **options,
    ))


async def ready(client: aredis.Redis | RedisCluster) -> None:
    """Load a cluster client's slot map before commands run concurrently on it: redis-py
    initializes lazily on the first command, and concurrent first commands break each
    other's connections ("Connection closed", a writer of None). A no-op on a single Redis."""
    if is_cluster_client(client):
        await client.initialize()


async def forget_topology(client: aredis.Redis | RedisCluster) -> None:
    """After a failure on a connection only pub/sub uses (which never refreshes the slot
    map by itself): drop a cluster client's connections and map, so the next `ready`
    loads the map afresh. A no-op on a single Redis."""
    if is_cluster_client(client):
        with contextlib.suppress(Exception):
            await client.aclose()


Stage = Callable[[Any], None]
"""Queues commands on a pipeline."""


async def in_order(
    client: aredis.Redis | RedisCluster, *stages: Stage, raise_on_error: bool = True
) -> list[Any]:
    """Run the stages' commands so that each stage is applied before the next begins.

    A single Redis runs one pipeline's commands in order: one round trip for all. A
    cluster pipeline sends each node its batch concurrently, so each stage gets its own
    round trip there. With `raise_on_error=False`, a command Redis refused is its
    exception in the results (the others ran)."""
    if not is_cluster_client(client):
        async with client.pipeline(transaction=False) as pipe:
            for stage in stages:
                stage(pipe)
            return list(await pipe.execute(raise_on_error=raise_on_error))
    results: list[Any] = []
    for stage in stages:
        async with client.pipeline(transaction=False) as pipe:
            stage(pipe)
            results += await pipe.execute(raise_on_error=raise_on_error)
    return results


def _without_password(url: str) -> str:
    head, at, tail = url.rpartition("@")
    return f"{head.split('//')[0]}//***@{tail}" if at else url


POLL_EVERY = 0.1
"""How often sharded streams are polled on a cluster when nothing arrived."""


async def latest_ids(client: aredis.Redis | RedisCluster, streams: Sequence[str]) -> dict[str, str]:
    """Each stream's newest entry id ("0-0" when empty): where "from now on" starts
    (XREAD's `$` cannot be polled)."""
    async with client.pipeline(transaction=False) as pipe:
        for stream in streams:
            pipe.xrevrange(stream, count=1)
        newest = await pipe.execute()
    return {
        stream: (entries[0][0].decode() if entries else "0-0")
        for stream, entries in zip(streams, newest, strict=True)
    }


async def xread_streams(
    client: aredis.Redis | RedisCluster, positions: dict[str, Any], *, count: int, block_ms: int
) -> list[tuple[Any, list[Any]]]:
    """XREAD of several streams (no consumer group), `positions` advanced by the caller.

    One blocking XREAD where the streams may share a command (a single Redis); on a
    cluster one non-blocking XREAD per stream in one pipeline (each node answers for its
    own), polled every POLL_EVERY seconds while nothing arrives, up to `block_ms`."""
    if not is_cluster_client(client) or len(positions) == 1:
        response: Any = await client.xread(positions, count=count, block=block_ms)  # type: ignore[arg-type]
        return list(response or [])
    waited = 0.0
    while True:
        async with client.pipeline(transaction=False) as pipe:
            for stream, last in positions.items():
                pipe.xread({stream: last}, count=count)
            answers = await pipe.execute()
        found = [item for answer in answers for item in (answer or [])]
        if found or waited * 1000 >= block_ms:
            return found
        await asyncio.sleep(POLL_EVERY)
        waited += POLL_EVERY
