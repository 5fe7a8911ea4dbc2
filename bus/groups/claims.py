"""Which pending entries of a consumer group are orphans, and taking them over.

An entry delivered to a consumer stays pending until that consumer acks it. It is an
orphan, to be claimed by a live consumer, when it has been idle at least `claim_idle`
seconds and one of these holds:

- its consumer is dead: no heartbeat in the last `claim_idle` seconds (heartbeats are
  written every `heartbeat_every(claim_idle)`), or none at all;
- it is this consumer's own, and this consumer is not working on it: delivered before
  this process started (a restart under the same consumer name; the new process never
  reads its old entries otherwise), or while it has spare capacity (so the entry is not
  waiting in its prefetch buffer: an XREADGROUP whose reply was lost in a dropped
  connection delivered it, but it never arrived);
- it has been idle longer than `long_idle` whoever holds it (a live consumer that
  prefetched it and never got to it, or lost track of it).

Entries a live consumer is working on are never idle long: it renews their claim
(XCLAIM JUSTID) every `claim_idle / 3` seconds. Entries it prefetched but did not start
yet are protected by its fresh heartbeat. The claim itself (XCLAIM with min-idle-time)
is atomic, so two claimers never both get an entry.

A claimer only claims when it has reached Redis without trouble (no failed or slow call,
no gap between its heartbeats) for `Steadiness.grace` seconds: right after a Redis outage
every heartbeat in Redis is old, and live peers need a moment (their client's retry
backoff, then one heartbeat) to refresh theirs. A claim pass whose own scan was slow is
dropped for the same reason.
"""

from __future__ import annotations

import time
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aredis

from hookbus.bus.connection.values import text

MIN_LONG_IDLE = 60.0
RETRY_CAP = 1.0
"""The longest pause between reconnection attempts of the services' Redis clients."""


def heartbeat_every(claim_idle: float, default: float = 2.0) -> float:
    """How often a consumer writes its heartbeat so that `claim_idle` can judge it dead."""
    return max(0.05, min(default, claim_idle / 4))


def long_idle_for(claim_idle: float) -> float:
    return max(MIN_LONG_IDLE, 10 * claim_idle)


class Steadiness:
    """Since when this process has reached Redis without trouble."""

    def __init__(self, claim_idle: float) -> None:
        self.every = heartbeat_every(claim_idle)
        self.slow_after = max(0.5, claim_idle / 4)
        self.grace = claim_idle + RETRY_CAP + self.every
        self._since = time.monotonic()
        self._last_ok = self._since

    def started(self) -> None:
        """The process just started consuming: wait a grace before claiming anything."""
        self._since = self._last_ok = time.monotonic()

    def trouble(self) -> None:
        self._since = time.monotonic()

    def call_took(self, started: float) -> None:
        """After a Redis call begun at `started` (monotonic) succeeded."""
        now = time.monotonic()
        if now - started > self.slow_after:
            self._since = now

    def heartbeat_ok(self, started: float) -> None:
        """After a heartbeat begun at `started` succeeded: a slow one, or a gap since the
        previous one, means trouble (an outage the client's retries rode through)."""
        now = time.monotonic()
        if now - started > self.slow_after or now - self._last_ok > 2 * self.every + self.slow_after:
            self._since = now
        self._last_ok = now

    def steady(self) -> bool:
        """No trouble for `grace` seconds, and our own heartbeat is not overdue (a call
        blocked in the client's retries during an outage has not failed, yet)."""
        now = time.monotonic()
        if now - self._last_ok > 2 * self.every + self.slow_after:
            return False
        return now - self._since >= self.grace


@dataclass(frozen=True)
class Orphan:
    entry_id: str
    consumer: str
    idle_ms: int
    deliveries: int
    """Deliveries so far (before the claim)."""


@dataclass(frozen=True)
class Claimed:
    entry_id: str
    fields: dict[bytes, bytes]
    attempt: int
    """This delivery's number, counting from 1."""
    previous_owner: str
    stream: str = ""
    """The stream (shard) it was claimed on."""


@dataclass(frozen=True)
class OrphanRules:
    """Which pending entries of one consumer group this consumer takes over (see the module
    docstring): the group, who "me" is, where the heartbeats are, and the idle thresholds."""

    stream: str
    group: str
    me: str
    heartbeats: str
    """The sorted set of consumer -> last heartbeat (unix seconds)."""
    claim_idle: float
    long_idle: float | None = None
    count: int = 1000
    """Pending entries looked at per pass."""


@dataclass(frozen=True)
class Workload:
    """What this consumer is doing right now, as the orphan rules need to know it."""

    busy: Container[str]
    """The entries it is working on."""
    spare: bool
    """Whether it could take more work now (then it holds no prefetched entry)."""
    uptime: float
    """Seconds since this process started consuming."""


async def find_orphans(client: aredis.Redis, rules: OrphanRules, now: Workload) -> list[Orphan]:
    """Pending entries of the group that should be taken over (see the module docstring)."""
    idle_ms = int(rules.claim_idle * 1000)
    pending: list[dict[str, Any]] = await client.xpending_range(
        rules.stream, rules.group, min="-", max="+", count=rules.count, idle=idle_ms
    )
    if not pending:
        return []
    long_ms = int((rules.long_idle or long_idle_for(rules.claim_idle)) * 1000)
    others = sorted({text(p["consumer"]) for p in pending} - {rules.me})
    scores = await client.zmscore(rules.heartbeats, others) if others else []
    wall = time.time()
    alive = {
        c for c, s in zip(others, scores, strict=True) if s is not None and wall - float(s) < rules.claim_idle
    }
    uptime_ms = now.uptime * 1000
    orphans = []
    for p in pending:
        entry_id = text(p["message_id"])
        if entry_id in now.busy:
            continue
        consumer = text(p["consumer"])
        idle = int(p["time_since_delivered"])
        if consumer == rules.me:
            orphan = now.spare or idle > uptime_ms or idle > long_ms
        else:
            orphan = consumer not in alive or idle > long_ms
        if orphan:
            orphans.append(Orphan(entry_id, consumer, idle, int(p["times_delivered"])))
    return orphans


async def claim(client: aredis.Redis, rules: OrphanRules, orphans: list[Orphan]) -> list[Claimed]:
    """XCLAIM the orphans (those still idle: a racing claimer wins each entry only once)."""
    if not orphans:
        return []
    by_id = {o.entry_id: o for o in orphans}
    entries: list[Any] = await client.xclaim(
        rules.stream, rules.group, rules.me, int(rules.claim_idle * 1000), list(by_id), idle=None
    )
    claimed = []
    for entry_id, fields in entries:
        if entry_id is None:  # deleted from the stream while pending (XDEL): nothing to run
            continue
        claimed_id = text(entry_id)
        orphan = by_id.get(claimed_id)
        if orphan is None:
            continue
        claimed.append(Claimed(claimed_id, fields, orphan.deliveries + 1, orphan.consumer, rules.stream))
    return claimed
