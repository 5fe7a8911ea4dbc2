"""A replica's silence while Redis itself was unreachable is not held against it.

A replica counts as live while its last heartbeat is at most REPLICA_TTL seconds old. While
Redis restarts, nobody can beat, so when it answers again every heartbeat it holds is as old
as the outage: a group whose replicas were all alive looked dead until each of them beat
again, and a request that came in meanwhile had that group's hooks skipped (a `make
deploy-check` run lost a RequestLogger's finalize_connection this way; a critical hook's
request got a 503 `no_worker` instead).

So an orchestrator's registry view measures how long its own reads waited on Redis, and for
REPLICA_TTL seconds after Redis answers again that wait is not counted against a heartbeat:
a replica has as long to beat again after the outage as it had left before it, and one that
does not beat again is dead as before. A wait shorter than a heartbeat period costs no
replica a beat, so it changes nothing.
"""

from __future__ import annotations

import time


class OutageGrace:
    """The oldest heartbeat that still counts as live, for one reader of the registry."""

    def __init__(self, *, ttl: float, shortest: float) -> None:
        """`ttl`: how old a live replica's heartbeat may be; `shortest`: the heartbeat period."""
        self.ttl = ttl
        self.shortest = shortest
        self._waiting_since: float | None = None
        """Wall time the first read since the last answered one started (None: none waits)."""
        self._excused = 0.0
        self._excused_until = 0.0

    def reading(self) -> None:
        """Before each read of the heartbeats (a failed read leaves the wait running)."""
        if self._waiting_since is None:
            self._waiting_since = time.time()

    def answered(self) -> float:
        """After a read Redis answered: the oldest heartbeat (unix time) that is live now."""
        now = time.time()
        waited = now - (self._waiting_since if self._waiting_since is not None else now)
        self._waiting_since = None
        if waited >= self.shortest and waited > self._in_force(now):
            self._excused, self._excused_until = waited, now + self.ttl
        return self.oldest_live(now)

    def oldest_live(self, now: float | None = None) -> float:
        now = time.time() if now is None else now
        return now - self.ttl - self._in_force(now)

    def _in_force(self, now: float) -> float:
        return self._excused if now < self._excused_until else 0.0
