"""What the orchestrator service and a worker replica share: a FastStream app on one broker.

FastStream runs the process (signals, startup and shutdown hooks, graceful drain); the
subclass fills in the four hooks. `start`/`stop` run the same sequence without FastStream's
signal handling, for tests and `hookbus run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import structlog
from faststream import FastStream
from redis.exceptions import ResponseError

from hookbus.bus.connection.retrying import RECONNECT_ERRORS, broker_class, broker_retry, connect

log = structlog.get_logger("hookbus.startup")

MEMORY_POLL = 1.0
"""Seconds between looks at Redis's memory while it is full at start-up."""


async def wait_for_memory(redis_url: str) -> None:
    """Until Redis takes writes: a service started while Redis is at `maxmemory` (policy
    noeviction) would fail its first write (consumer groups, heartbeats) and exit; it
    waits instead, saying so once. A Redis that will not tell (INFO not allowed to this
    user) is taken as having room."""
    client = connect(redis_url, retries=0)
    said = False
    try:
        while True:
            try:
                memory = await client.info("memory")
            except (ResponseError, *RECONNECT_ERRORS):
                return
            limit, used = int(memory.get("maxmemory", 0)), int(memory.get("used_memory", 0))
            if not limit or used < limit:
                if said:
                    log.info("redis_has_memory_again", used=used, maxmemory=limit)
                return
            if not said:
                log.warning("waiting_for_redis_memory", used=used, maxmemory=limit)
                said = True
            await asyncio.sleep(MEMORY_POLL)
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()


class BusApp:
    def __init__(self, redis_url: str, *, graceful_timeout: float) -> None:
        self._redis_url = redis_url
        self.broker = broker_class(redis_url)(
            redis_url,
            graceful_timeout=graceful_timeout,
            logger=logging.getLogger("faststream.hookbus"),
            log_level=logging.DEBUG,
            **broker_retry(),
        )
        self.app = FastStream(
            self.broker,
            on_startup=[self._wait_for_memory, self._before_startup],
            after_startup=[self._after_startup],
            on_shutdown=[self._on_shutdown],
            after_shutdown=[self._after_shutdown],
        )

    async def start(self) -> None:
        await self._wait_for_memory()
        await self._before_startup()
        await self.broker.start()
        await self._after_startup()

    async def stop(self) -> None:
        await self._on_shutdown()
        await self.broker.stop()
        await self._after_shutdown()

    async def _wait_for_memory(self) -> None:
        await wait_for_memory(self._redis_url)

    async def _before_startup(self) -> None:
        """Before the broker consumes: create consumer groups."""

    async def _after_startup(self) -> None:
        """The broker is connected and consuming: start background work."""

    async def _on_shutdown(self) -> None:
        """Before FastStream drains in-flight handlers."""

    async def _after_shutdown(self) -> None:
        """After the drain: stop what in-flight work still needed."""
