"""Orchestrator services of one process may share one Agent: each request's hops still go
through the service that runs it, so the version pins it takes are the ones it releases."""

from __future__ import annotations

import asyncio
from typing import Any

from hookbus import Agent
from hookbus.bus.groups.versions import serving_counts
from tests.integration.stack import Upper, running_stack
from tests.waiting import wait_for


async def test_two_services_sharing_an_agent_release_every_pin_they_take(redis_url, prefix):
    agent = Agent("shared")
    async with running_stack(redis_url, prefix, agent, {"shout": [Upper()]}, orchestrators=2) as (client, services, _):
        ids = [f"chatcmpl-shared-{n}" for n in range(24)]
        texts = await asyncio.gather(*(_text(client.stream(f"[[echo]] hi {n}", completion_id=cid)) for n, cid in enumerate(ids)))
        assert all(service.served > 0 for service in services), [s.served for s in services]
        assert services[0].runtime is not None
        versions = list(services[0].runtime.registry.versions["shout"])
        assert versions

        async def none_served() -> bool:  # published within PUBLISH_EVERY of the last request's end
            return await serving_counts(client.redis, client.keys, "shout", versions) == dict.fromkeys(versions, 0)

        served_none = await wait_for(none_served, timeout=5)
        pinned = [s.runtime.pins.pinned(cid) for s in services for cid in ids if s.runtime is not None]
    assert texts == [f"HI {n}" for n in range(24)]  # each chunk through the group's on_chunk hook
    # every request ended where it ran: no version still counts it as served, no service
    # still holds a pin of it (a pin taken by another service's runtime would stay)
    assert served_none
    assert pinned == [{}] * len(pinned)


async def _text(chunks: Any) -> str:
    return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
