"""A request's observation entries, one per observer group, appended off the request's path.

Each group's entry goes out with the next pipeline of hops (ReplyRouter.append); no stage
waits for it, the request's ack does (`ObservationOutbox.stored`). One that Redis could not
take (a restart: refused, or a pooled connection the restart closed) is sent again with
backoff for up to OBSERVATIONS_RETRY_FOR seconds; only one Redis refused for good, or past
that, is lost, and logged (at least once holds from the entry on). Before, the first
failure lost it: a RequestLogger's finalize line (make deploy-check, a request answered
right after a Redis restart).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import structlog

from hookbus.bus.connection.retrying import retryable
from hookbus.bus.hops.reply_router import ReplyRouter
from hookbus.bus.keys import Keys

log = structlog.get_logger("hookbus.bus_runtime")

OBSERVATIONS_RETRY_FOR = 30.0
"""Seconds a request's observations are sent again while Redis cannot take them (a restart)."""


class ObservationOutbox:
    """The observation entries this process is appending, by request, until stored."""

    def __init__(self, keys: Keys, router: ReplyRouter) -> None:
        self.keys = keys
        self.router = router
        self._observing: set[asyncio.Task[None]] = set()
        """Observation entries being appended (the request's ack and shutdown wait for them)."""
        self._sending: dict[str, asyncio.Task[None]] = {}
        """Each request's observation entries being appended, by completion id."""
        self.sent = 0

    def send(self, completion_id: str, entries: Sequence[tuple[str, dict[bytes, bytes]]]) -> None:
        """Append each (group, entry) to the group's observer stream, waiting for none."""
        if not entries:
            return
        appended = []
        for group, fields in entries:
            stream = self.keys.observe_for(group, completion_id)
            appended.append((stream, fields, self.router.append(stream, fields)))
        task = asyncio.ensure_future(self._appended(completion_id, appended))
        self._observing.add(task)
        self._sending[completion_id] = task

        def done(_: asyncio.Task[None]) -> None:
            self._observing.discard(task)
            self._sending.pop(completion_id, None)

        task.add_done_callback(done)

    async def stored(self, completion_id: str, timeout: float) -> None:
        """Wait (up to `timeout` s) until the request's observation entries are stored. The
        request is acked after them: an orchestrator that dies in between leaves it pending,
        and the one that recovers it publishes its finalize_connection's observation again,
        so that one is delivered at least once. They went out with the request's last
        appends, so this is at most the rest of that round trip."""
        sending = self._sending.get(completion_id)
        if sending is not None:
            await asyncio.wait({sending}, timeout=timeout)

    async def _appended(
        self, completion_id: str, appended: list[tuple[str, dict[bytes, bytes], asyncio.Future[None]]]
    ) -> None:
        """Wait for a request's entries, in one task (not one per entry), sending again
        what Redis could not take for now."""
        give_up = time.monotonic() + OBSERVATIONS_RETRY_FOR
        for stream, fields, future in appended:
            backoff = 0.05
            while True:
                try:
                    await future
                    self.sent += 1
                    break
                except Exception as exc:  # noqa: BLE001 - an observer never fails a request
                    if not retryable(exc) or time.monotonic() + backoff > give_up:
                        log.warning("observations_not_sent", stream=stream, completion_id=completion_id, error=str(exc))
                        break
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                future = self.router.append(stream, fields)

    async def flushed(self, timeout: float) -> None:
        """Wait (up to `timeout` s) for the observation entries still being appended: a
        stopping orchestrator sends them before it closes its connection."""
        if self._observing:
            await asyncio.wait(set(self._observing), timeout=timeout)
