"""How long a replica told to stop (SIGTERM, Kubernetes' preStop) keeps serving.

It marks itself draining at once, so orchestrators pin no new request to its version
while another version takes them (hookbus.bus.groups.versions.choose_version). Then:

- a sibling of its version that is not draining lives: it stops reading at once (the
  sibling serves the requests pinned to the version);
- it is the last replica of its version that is not draining: it keeps serving the
  hops of the requests already pinned to its version until none is left (their
  `serving:` count is zero), so that no request changes version mid-way; when another
  version takes new requests, it first waits `PIN_SETTLE` seconds, the time every
  orchestrator needs to see it draining (a registry refresh) and to publish the pins it
  took before that (hookbus.services.orchestrator.serving.version_pins), so that a request pinned
  by an orchestrator that had not seen it yet is waited for too.

Either way it waits at most `limit` seconds; what it holds then is finished (replies
written, acked) before it leaves the group.
"""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aredis
import structlog

from hookbus.bus.groups.registry import REFRESH_EVERY
from hookbus.bus.groups.versions import PUBLISH_EVERY, live_versions, serving_counts
from hookbus.bus.keys import Keys

log = structlog.get_logger("hookbus.worker.drain")

PIN_SETTLE = 2 * REFRESH_EVERY + PUBLISH_EVERY + 0.25
POLL_EVERY = 0.1


async def serve_pinned_requests(
    client: aredis.Redis, keys: Keys, group: str, replica: str, version: str, *, limit: float, alive_within: float
) -> None:
    """Return once this replica may stop reading (see the module docstring). A sibling
    counts as serving on only with a heartbeat in the last `alive_within` seconds (the
    replicas' claim idle: a sibling that crashed a moment ago is no heir)."""
    began = time.monotonic()
    while time.monotonic() - began < limit:
        states = await live_versions(client, keys, group, alive_within=alive_within)
        mine = states.get(version)
        if mine is not None and any(r not in mine.draining and r != replica for r in mine.replicas):
            log.info("drain_sibling_serves", group=group, version=version, replica=replica)
            return
        others_open = any(s.takes_new_requests for v, s in states.items() if v != version)
        settled = not others_open or time.monotonic() - began >= PIN_SETTLE
        serving = (await serving_counts(client, keys, group, [version]))[version]
        if settled and serving == 0:
            log.info("drain_version_done", group=group, version=version, replica=replica,
                     waited_s=round(time.monotonic() - began, 2))
            return
        await asyncio.sleep(POLL_EVERY)
    log.warning("drain_limit_reached", group=group, version=version, replica=replica, limit_s=limit)
