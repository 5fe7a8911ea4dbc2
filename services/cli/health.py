"""`hookbus health`: the liveness probe of a worker or orchestrator container.

It asks Redis whether a replica on this host (the pod or container name is in every
replica name) has a fresh heartbeat; it imports little and gives up within seconds.
"""

from __future__ import annotations

import socket
import time

import redis.asyncio as aredis

from hookbus.bus.connection.cluster import keys_for
from hookbus.bus.connection.retrying import connect
from hookbus.bus.connection.values import text
from hookbus.bus.groups.registry import REPLICA_TTL


async def check_health(redis_url: str, prefix: str, role: str | None, group: str | None) -> tuple[bool, str]:
    keys = keys_for(redis_url, prefix)
    host = socket.gethostname()
    client = connect(redis_url, max_connections=4, retries=0, socket_timeout=3)
    try:
        if role == "worker" and not group:
            return False, "--group is required with --role worker"
        sets: list[str] = []
        if role in (None, "orchestrator"):
            sets.append(keys.orchestrators)
        if role == "worker":
            sets.append(keys.replicas(group or ""))
        if role is None:
            sets.extend(keys.replicas(text(g)) for g in await client.hkeys(keys.registry))
        fresh_after = time.time() - REPLICA_TTL
        found = []
        for key in sets:
            members = await client.zrangebyscore(key, fresh_after, "+inf")
            names = [text(m) for m in members]
            found += [n for n in names if f"-{host}-" in n or n.endswith(host)]
        if found:
            return True, f"healthy: {', '.join(found)}"
        if role is None:
            return True, f"no hookbus service heartbeats from {host} (none running here)"
        return False, f"no fresh {role} heartbeat from {host}"
    except (OSError, aredis.RedisError) as exc:
        return False, f"redis unreachable: {exc}"
    finally:
        await client.aclose()
