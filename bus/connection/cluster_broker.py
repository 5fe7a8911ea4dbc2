"""FastStream's Redis Cluster broker, on a client that survives a slot map reload.

The services run most of their own commands (journal scripts, replies, registry,
events) and FastStream its consumer reads and acks on the broker's client, which
FastStream builds itself as a plain `RedisCluster`; here it is given the same
connections as hookbus's other cluster clients (hookbus.bus.connection.cluster.ToleratingConnection).
Kept apart from hookbus.bus.connection.cluster so that clients that never build a broker do not
import FastStream.
"""

from __future__ import annotations

from typing import Any

from faststream.redis import RedisClusterBroker
from faststream.redis.configs.state import ConnectionState, RedisClusterConnectionState
from redis.asyncio.cluster import RedisCluster

from hookbus.bus.connection.cluster import tolerate_closed_connections


class _ToleratingClusterState(RedisClusterConnectionState):
    __slots__ = ()

    async def connect(self) -> RedisCluster:
        return tolerate_closed_connections(await super().connect())


class ClusterBroker(RedisClusterBroker):
    def _make_connection_state(self, connection_options: dict[str, Any], kwargs: dict[str, Any]) -> ConnectionState[Any]:
        return _ToleratingClusterState(connection_options)
