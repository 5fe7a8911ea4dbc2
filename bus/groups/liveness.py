"""Heartbeats and lease renewal on a thread of their own, with their own Redis connection.

Peers judge a process dead by its heartbeat, and take over its requests when their
leases stop being renewed. Both used to be tasks on the process's event loop, so a loop
kept busy by one large request (or a hook that blocks) looked exactly like a dead
process, and a peer claimed requests that were still running (a false 503
`orchestrator_lost`). Here they run on a daemon thread that the loop cannot hold up, so
a process is taken for dead only when it is: killed, stopped (SIGSTOP stops every
thread), or wedged, i.e. its loop has not run for `wedged_after` seconds (then the thread
stops vouching for it, and peers recover its requests as from a crash).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis
import structlog

from hookbus.bus.connection.cluster import is_cluster
from hookbus.bus.connection.retrying import RECONNECT_ERRORS, out_of_memory

log = structlog.get_logger("hookbus.liveness")

WEDGED_AFTER = 300.0
"""Seconds the event loop may be held before the process stops calling itself alive."""


def sync_client(url: str) -> redis.Redis:
    """A blocking client of its own for the thread (a cluster client on a cluster)."""
    options: dict[str, object] = {"socket_connect_timeout": 2, "socket_timeout": 5}
    if is_cluster(url):
        return redis.RedisCluster.from_url(url, require_full_coverage=False, **options)  # type: ignore[return-value]
    return redis.Redis.from_url(url, **options)


@dataclass(frozen=True)
class Job:
    """`run(client)` every `every` seconds; `what` names it in the logs."""

    what: str
    every: float
    run: Callable[[redis.Redis], None]


class LivenessThread:
    def __init__(
        self,
        redis_url: str,
        jobs: Sequence[Job],
        *,
        name: str,
        wedged_after: float = WEDGED_AFTER,
        on_trouble: Callable[[], None] | None = None,
    ) -> None:
        self.redis_url = redis_url
        self.jobs = list(jobs)
        self.name = name
        self.wedged_after = wedged_after
        self.on_trouble = on_trouble
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_seen = time.monotonic()
        self._failing: set[str] = set()
        self._wedged = False

    def start(self) -> None:
        """Start vouching for the event loop that is running now."""
        self._loop = asyncio.get_running_loop()
        self._loop_seen = time.monotonic()
        self._stop.clear()
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)
            self._thread = None

    def _seen(self) -> None:
        self._loop_seen = time.monotonic()

    def _main(self) -> None:
        client = sync_client(self.redis_url)
        due = {job.what: 0.0 for job in self.jobs}
        tick = min(job.every for job in self.jobs)
        try:
            while not self._stop.is_set():
                assert self._loop is not None
                try:
                    self._loop.call_soon_threadsafe(self._seen)
                except RuntimeError:  # the loop is closed: the process is going away
                    return
                if not self._loop_alive():
                    self._stop.wait(tick)
                    continue
                now = time.monotonic()
                for job in self.jobs:
                    if now >= due[job.what]:
                        due[job.what] = now + job.every
                        self._run(job, client)
                self._stop.wait(max(0.0, min(due.values()) - time.monotonic()))
        finally:
            client.close()

    def _loop_alive(self) -> bool:
        held = time.monotonic() - self._loop_seen
        wedged = held > self.wedged_after
        if wedged != self._wedged:
            self._wedged = wedged
            if wedged:
                log.error("event_loop_wedged", thread=self.name, held_s=round(held, 1))
            else:
                log.warning("event_loop_back", thread=self.name)
        return not wedged

    def _run(self, job: Job, client: redis.Redis) -> None:
        try:
            job.run(client)
        except Exception as exc:  # noqa: BLE001 - the thread must outlive any one failure
            if not (isinstance(exc, RECONNECT_ERRORS) or out_of_memory(exc)):
                log.exception(f"{job.what}_failed")
                return
            if self.on_trouble is not None:
                self.on_trouble()
            if job.what not in self._failing:  # one line when it starts failing, not one per try
                self._failing.add(job.what)
                log.warning(f"{job.what}_failing", error=str(exc))
            return
        if job.what in self._failing:
            self._failing.discard(job.what)
            log.info(f"{job.what}_recovered")
