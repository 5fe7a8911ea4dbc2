"""A connection closed by another task under a command, on a real Redis Cluster.

During a slot map reload (a failover, a slot migration) redis-py closes connections that
other tasks of the same client hold: here that is done on purpose, at the point where the
command waits to write, for every kind of command hookbus sends (single commands,
scripts, pipelines, blocking reads) on both its clients (its own and FastStream's). The
command must come back answered (the client retried it on a fresh connection), or, on a
client that does not retry, fail with a connection error its read loop backs off on.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError

from hookbus.bus.connection.cluster import ToleratingSSLConnection, tolerate_closed_connections
from hookbus.bus.connection.retrying import broker_class, broker_retry, connect
from tests.embedded_cluster import EmbeddedCluster

Operation = Callable[[RedisCluster, str], Awaitable[Any]]


async def single_command(client: RedisCluster, key: str) -> Any:
    return await client.get(key)


async def script(client: RedisCluster, key: str) -> Any:
    return await client.register_script("return redis.call('GET', KEYS[1])")(keys=[key])


async def pipeline(client: RedisCluster, key: str) -> Any:
    async with client.pipeline(transaction=False) as pipe:
        pipe.get(key)
        pipe.strlen(key)
        return (await pipe.execute())[0]


@pytest.fixture(params=["hookbus", "faststream"])
async def cluster_client(request: pytest.FixtureRequest, redis_cluster: EmbeddedCluster) -> AsyncIterator[RedisCluster]:
    """The client hookbus's own code builds (`connect`), and the one FastStream's broker
    runs the services' commands on."""
    if request.param == "hookbus":
        client = connect(redis_cluster.url)
        assert isinstance(client, RedisCluster)
        yield client
        await client.aclose()
        return
    broker = broker_class(redis_cluster.url)(redis_cluster.url, **broker_retry())
    yield await broker.connect()
    await broker.stop()


async def closed_under(client: RedisCluster, key: str, operation: Operation) -> Any:
    """Start `operation`; once it holds a connection of the node serving `key` (it is then
    waiting to write on it), close that connection as a slot map reload does, and return
    what the operation returns."""
    node = client.get_node_from_key(key)
    running = asyncio.ensure_future(operation(client, key))
    deadline = asyncio.get_running_loop().time() + 5  # a loaded machine: a blocking read first asks a node for its keys
    while True:
        held = [connection for connection in node._connections if connection not in node._free]
        if held:
            break
        assert not running.done(), "the operation ended before it held a connection"
        if asyncio.get_running_loop().time() > deadline:
            running.cancel()
            raise AssertionError("the operation never took a connection")
        await asyncio.sleep(0)
    for connection in held:
        await connection.disconnect(nowait=True)
    return await running


@pytest.mark.parametrize("operation", [single_command, script, pipeline], ids=["command", "script", "pipeline"])
async def test_a_command_whose_connection_another_task_closed_is_sent_again_and_answered(
    cluster_client: RedisCluster, operation: Operation
) -> None:
    key = f"closed:{{{uuid.uuid4().hex}}}"
    await cluster_client.set(key, b"value")
    assert await operation(cluster_client, key) == b"value"  # the node's connection is open and free again
    assert await closed_under(cluster_client, key, operation) == b"value"


async def test_on_a_client_without_retries_the_closed_connection_is_a_connection_error(
    redis_cluster: EmbeddedCluster,
) -> None:
    """Blocking reads use `retries=0` clients and back off on connection errors in their
    own loops: what they see must be one of those, not redis-py's AttributeError."""
    reader = connect(redis_cluster.url, retries=0)
    assert isinstance(reader, RedisCluster)
    stream = f"closed:{{{uuid.uuid4().hex}}}"
    await reader.xadd(stream, {"n": 1})

    async def blocking_read(client: RedisCluster, key: str) -> Any:
        return await client.xread({key: "$"}, count=1, block=500)

    try:
        assert not await blocking_read(reader, stream)  # nothing new: the read timed out
        with pytest.raises(RedisConnectionError):
            await closed_under(reader, stream, blocking_read)
        assert not await blocking_read(reader, stream)  # and the client reads on
    finally:
        await reader.aclose()


async def test_a_tls_cluster_client_opens_its_tolerating_connections_over_tls() -> None:
    """`rediss://`: the connections stay TLS ones (built only: no node is contacted)."""
    client = tolerate_closed_connections(RedisCluster(host="127.0.0.1", port=6390, ssl=True))
    node = client.get_default_node() or next(iter(client.nodes_manager.startup_nodes.values()))
    assert node.connection_class is ToleratingSSLConnection
    assert client.nodes_manager.connection_kwargs["connection_class"] is ToleratingSSLConnection
