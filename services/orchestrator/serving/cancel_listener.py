"""The cancel signals gateways publish (`{prefix}cancel` channel), turned into cancelled runs.

A signal missed while the subscription was down is caught by the cancel marker
(`{prefix}cancel:{completion_id}`), which a run's journal reads when it begins and each
lease renewal reads after (hookbus.services.orchestrator.serving.recovery).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import redis.asyncio as aredis
import structlog

from hookbus.bus.connection.cluster import forget_topology, ready
from hookbus.bus.connection.retrying import RECONNECT_ERRORS, connect
from hookbus.bus.connection.values import text
from hookbus.bus.keys import Keys
from hookbus.services.gateway.cancel import CLIENT_STALLED
from hookbus.services.orchestrator.serving.run_table import RunTable

log = structlog.get_logger("hookbus.orchestrator")


async def listen_for_cancels(redis_url: str, keys: Keys, client: Callable[[], aredis.Redis], runs: RunTable) -> None:
    """Cancel each run a signal names until cancelled, on a connection of its own,
    subscribing again after each Redis failure. `client`: the service's client, for the
    marker that says why."""
    backoff = 0.1
    reader = connect(redis_url, retries=0)
    try:
        while True:
            pubsub: Any = None
            try:
                await ready(reader)  # on a cluster: the node serving the channel's slot
                pubsub = reader.pubsub()
                await pubsub.subscribe(keys.cancel_channel)
                backoff = 0.1
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message and message.get("type") == "message":
                        cid = text(message["data"])
                        # why, from the marker (one read, on a rare path): a stalled client's
                        # run is finalized with that code
                        why = await client().get(keys.cancel(cid))
                        runs.cancel(cid, stalled=why is not None and text(why) == CLIENT_STALLED)
            except RECONNECT_ERRORS as exc:
                log.warning("cancel_listener_reconnecting", error=str(exc), retry_in=backoff)
                await forget_topology(reader)  # that node may be gone (failover)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()
    finally:
        with contextlib.suppress(Exception):
            await reader.aclose()
