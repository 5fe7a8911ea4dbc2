"""One consumer of a consumer group, as an orchestrator (group `orchestrators` on `requests`)
and every worker replica (group `{group}` on `hooks:{group}`) are: the four background
loops that keep a group healthy, written once.

- **heartbeat** (every `heartbeat_every(claim_idle)`): `beat()` writes this consumer's
  heartbeat; a slow or missed one marks the connection unsteady.
- **claim** (every `claim_idle / 2`, only while steady): the orphans of the group
  (hookbus.bus.groups.claims) are claimed, as many as this consumer has room for, and each one is
  handed to `take_over` as a task of its own.
- **lease** (every `claim_idle / 3`): `renew()` keeps the claims on what this consumer runs
  fresh, so a sibling never takes over a long-running entry of a live consumer.
- **janitor** (every `trim_every`): `tidy()` trims the stream and forgets old consumers.

The heartbeat and the lease run as tasks on the event loop (a worker replica), or, given
`on_thread` (an orchestrator, whose loop one large request may keep busy), on a liveness
thread with its own connection (bus/liveness.py), so a busy loop is not taken for dead.

What each service does in `beat`, `renew`, `tidy` and `take_over` is its own (a worker
renews with XCLAIM JUSTID, an orchestrator through its fenced journal); when to stop which
loop is its own too (`stop`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import redis
import redis.asyncio as aredis

from hookbus.bus.groups.claims import (
    Claimed,
    OrphanRules,
    Steadiness,
    Workload,
    claim,
    find_orphans,
    heartbeat_every,
)
from hookbus.bus.groups.liveness import Job, LivenessThread
from hookbus.bus.groups.periodic import cancel_and_wait, repeat
from hookbus.bus.groups.registry import HEARTBEAT_EVERY

Loop = Literal["heartbeat", "claim", "lease", "janitor"]


@dataclass(frozen=True)
class OnThread:
    """The heartbeat and the lease renewal as blocking calls, each given the liveness
    thread's own client; `name` names the thread."""

    redis_url: str
    name: str
    beat: Callable[[redis.Redis], Any]
    renew: Callable[[redis.Redis], Any]


class GroupMember:
    def __init__(
        self,
        rules: OrphanRules,
        *,
        client: Callable[[], aredis.Redis],
        concurrency: int,
        trim_every: float,
        busy: Callable[[], Collection[tuple[str, str]]],
        tidy: Callable[[], Awaitable[Any]],
        take_over: Callable[[Claimed], Awaitable[Any]],
        beat: Callable[[], Awaitable[Any]] | None = None,
        renew: Callable[[], Awaitable[Any]] | None = None,
        on_thread: OnThread | None = None,
        streams: Sequence[str] = (),
        answered: Callable[[], Collection[tuple[str, str]]] = frozenset,
    ) -> None:
        """`rules` name the first shard; `streams` every shard of the stream (default:
        `rules.stream` alone); `busy()` the (shard, entry id) pairs this consumer runs;
        `answered()` those it finished and will ack shortly (a deferred ack): never
        orphans, however long the ack is delayed, and taking no room.
        The heartbeat and the lease: `beat` and `renew` on the event loop, or `on_thread`."""
        assert (beat is None and renew is None) or on_thread is None, "beat and renew: on the loop or on a thread"
        self.rules = rules
        self.streams = list(streams) or [rules.stream]
        self.steadiness = Steadiness(rules.claim_idle)
        self.claimed = 0
        self._client = client
        self._concurrency = concurrency
        self._trim_every = trim_every
        self._busy = busy
        self._answered = answered
        self._beat = beat
        self._renew = renew
        self._tidy = tidy
        self._take_over = take_over
        self._on_thread = on_thread
        self._thread: LivenessThread | None = None
        self._started_at = time.monotonic()
        self._loops: dict[Loop, asyncio.Task[None]] = {}
        self.taken: set[asyncio.Task[Any]] = set()
        """Claimed entries still being run."""

    def start(self) -> None:
        """A fresh start: claim nothing before the peers' heartbeats could be seen."""
        self._started_at = time.monotonic()
        self.steadiness.started()
        claim_idle = self.rules.claim_idle
        self._loops = {
            "claim": asyncio.create_task(
                repeat(claim_idle / 2, self.claim_once, what="claim", when=self.steadiness.steady,
                       on_trouble=self.steadiness.trouble),
                name="hookbus-claim",
            ),
            "janitor": asyncio.create_task(
                repeat(self._trim_every, self._tidy, what="janitor"), name="hookbus-janitor"
            ),
        }
        beat_every, lease_every = heartbeat_every(claim_idle, HEARTBEAT_EVERY), claim_idle / 3
        if self._beat is not None:
            self._loops["heartbeat"] = asyncio.create_task(
                repeat(beat_every, self.heartbeat_once, what="heartbeat", on_trouble=self.steadiness.trouble),
                name="hookbus-heartbeat",
            )
        if self._renew is not None:
            self._loops["lease"] = asyncio.create_task(
                repeat(lease_every, self._renew, what="lease_renewal"), name="hookbus-lease"
            )
        if self._on_thread is not None:
            on_thread = self._on_thread

            def beat(client: redis.Redis) -> None:
                began = time.monotonic()
                on_thread.beat(client)
                self.steadiness.heartbeat_ok(began)

            self._thread = LivenessThread(
                on_thread.redis_url,
                [Job("heartbeat", beat_every, beat), Job("lease_renewal", lease_every, on_thread.renew)],
                name=on_thread.name, on_trouble=self.steadiness.trouble,
            )
            self._thread.start()

    async def stop(self, *loops: Loop) -> None:
        """Stop these loops (all of them when none is named; the liveness thread, which
        runs both, with the heartbeat or the lease)."""
        names: tuple[Loop, ...] = loops or ("heartbeat", "claim", "lease", "janitor")
        await cancel_and_wait(*(self._loops.pop(name, None) for name in names))
        thread = self._thread
        if thread is not None and ("heartbeat" in names or "lease" in names):
            self._thread = None
            await thread.stop()

    async def wait_taken(self, timeout: float) -> None:
        """Let the claimed entries still running finish, for up to `timeout` seconds."""
        if self.taken:
            await asyncio.wait(set(self.taken), timeout=timeout)

    def uptime(self) -> float:
        return time.monotonic() - self._started_at

    async def heartbeat_once(self) -> None:
        assert self._beat is not None
        began = time.monotonic()
        await self._beat()
        self.steadiness.heartbeat_ok(began)

    async def claim_once(self) -> int:
        """One claim pass over every shard: find the orphans, claim what there is room
        for, run each."""
        taken = 0
        for stream in self.streams:
            taken += await self._claim_shard(replace(self.rules, stream=stream))
        return taken

    async def _claim_shard(self, rules: OrphanRules) -> int:
        client = self._client()
        busy = self._busy()
        mine = {
            entry_id for stream, entry_id in (*busy, *self._answered()) if stream == rules.stream
        }
        began = time.monotonic()
        orphans = await find_orphans(
            client, rules, Workload(mine, len(busy) < self._concurrency, self.uptime())
        )
        self.steadiness.call_took(began)
        room = max(0, self._concurrency - len(busy))
        if not orphans or not room or not self.steadiness.steady():
            return 0
        claimed = await claim(client, rules, orphans[:room])
        for entry in claimed:
            task = asyncio.ensure_future(self._take_over(entry))
            self.taken.add(task)
            task.add_done_callback(self.taken.discard)
        self.claimed += len(claimed)
        return len(claimed)
