"""The console's reader: shared by every viewer, and silent when nobody watches."""

from __future__ import annotations

import asyncio

from hookbus.bus.connection.retrying import connect
from hookbus.bus.keys import Keys
from hookbus.services.console.data import ConsoleData
from tests.waiting import wait_for


async def test_viewers_share_one_poll_and_the_poller_stops_when_nobody_watches(redis_url: str, prefix: str) -> None:
    client = connect(redis_url, retries=0)
    data = ConsoleData(client, Keys(prefix), idle_after=0.5)
    try:
        first, second = await asyncio.gather(data.snapshot(), data.snapshot())
        assert first is second  # two viewers, one read
        assert data.polling

        async def stopped() -> bool:
            return not data.polling

        assert await wait_for(stopped, timeout=5)
        await asyncio.sleep(2.5)  # more than a poll interval
        assert not data.polling
        again = await data.snapshot()  # a viewer wakes it, and gets a fresh read, not the old one
        assert data.polling and again.bus.at > first.bus.at + 2.5
    finally:
        await data.stop()
        await client.aclose()
