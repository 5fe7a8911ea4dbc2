"""What the orchestrator service and a worker replica share: a FastStream app on one broker.

FastStream runs the process (signals, startup and shutdown hooks, graceful drain); the
subclass fills in the four hooks. `start`/`stop` run the same sequence without FastStream's
signal handling, for tests and `hookbus run`.
"""

from __future__ import annotations

import logging

from faststream import FastStream

from hookbus.bus.connection import broker_class, broker_retry


class BusApp:
    def __init__(self, redis_url: str, *, graceful_timeout: float) -> None:
        self.broker = broker_class(redis_url)(
            redis_url,
            graceful_timeout=graceful_timeout,
            logger=logging.getLogger("faststream.hookbus"),
            log_level=logging.DEBUG,
            **broker_retry(),
        )
        self.app = FastStream(
            self.broker,
            on_startup=[self._before_startup],
            after_startup=[self._after_startup],
            on_shutdown=[self._on_shutdown],
            after_shutdown=[self._after_shutdown],
        )

    async def start(self) -> None:
        await self._before_startup()
        await self.broker.start()
        await self._after_startup()

    async def stop(self) -> None:
        await self._on_shutdown()
        await self.broker.stop()
        await self._after_shutdown()

    async def _before_startup(self) -> None:
        """Before the broker consumes: create consumer groups."""

    async def _after_startup(self) -> None:
        """The broker is connected and consuming: start background work."""

    async def _on_shutdown(self) -> None:
        """Before FastStream drains in-flight handlers."""

    async def _after_shutdown(self) -> None:
        """After the drain: stop what in-flight work still needed."""
