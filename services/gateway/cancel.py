"""The cancellation signal a gateway sends when its client goes away.

When a client disconnects before its request ended (mid-stream, or while waiting for a
non-streamed answer) the gateway, in one pipelined round trip:

1. `SET {prefix}cancel:{completion_id} <reason> EX 3600` - the durable marker, so an
   orchestrator that picks the request up later (it was still queued) or missed the
   message below still sees it;
2. `PUBLISH {prefix}cancel <completion_id>` - the prompt nudge.

When Redis is out of memory (`maxmemory`, policy noeviction) it refuses the marker but
still takes the PUBLISH, so the request is cancelled all the same if it is running.

The orchestrator that runs the request cancels its agent task on either signal;
`finalize_connection` then runs once with a 499 error. The reason is
`client_disconnected` (the client closed the connection), `client_stalled` (it stopped
reading a streamed answer: hookbus.services.gateway.sse; finalize's error has that code)
or `gateway_stopped` (the gateway was shut down with the request still open).
"""

from __future__ import annotations

import redis.asyncio as aredis
import structlog
from redis.exceptions import ResponseError

from hookbus.bus.connection.retrying import RECONNECT_ERRORS, out_of_memory
from hookbus.bus.keys import Keys

log = structlog.get_logger("hookbus.gateway")

CANCEL_TTL = 3600
CLIENT_DISCONNECTED = "client_disconnected"
GATEWAY_STOPPED = "gateway_stopped"
CLIENT_STALLED = "client_stalled"


async def request_cancel(
    client: aredis.Redis, keys: Keys, completion_id: str, reason: str = CLIENT_DISCONNECTED
) -> bool:
    """Write the cancel marker and publish it; False if Redis could not be reached."""
    try:
        # two round trips, not one pipeline: a cluster pipeline cannot carry PUBLISH
        # (and a disconnect is rare); the marker first, so a listener that is told can see it
        await _mark(client, keys, completion_id, reason)
        await client.publish(keys.cancel_channel, completion_id)
    except RECONNECT_ERRORS as exc:
        log.warning("cancel_not_sent", completion_id=completion_id, error=str(exc))
        return False
    log.info("request_cancelled", completion_id=completion_id, reason=reason)
    return True


async def _mark(client: aredis.Redis, keys: Keys, completion_id: str, reason: str) -> None:
    try:
        await client.set(keys.cancel(completion_id), reason, ex=CANCEL_TTL)
    except ResponseError as exc:
        if not out_of_memory(exc):
            raise
        log.warning("cancel_marker_refused", completion_id=completion_id, error=str(exc))
