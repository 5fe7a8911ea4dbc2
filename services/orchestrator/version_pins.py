"""Which version of each worker group a request runs on (hookbus.bus.groups.versions).

At a request's first hop to a group, the version is chosen (`choose_version`: the newest
version taking new requests, or the canary for its share) and pinned: in this process,
in the request's journal (field `pin:{group}`, so that an orchestrator that recovers the
request keeps it: the journal's pin wins over a new choice), and in the version's
`serving:` count until the request ends (`release`). Every later hop of the request to
that group goes to the pinned version's stream, `hooks:{group}@{version}`, and so does
a stage a worker sends on (the route's streams are chosen here too).

The rule when no replica of the pinned version is left (each one crashed, or left
after its drain limit): the request moves to the version `choose_version` picks, at its
next hop to that group (a stage boundary: a hop is never split over versions), logged
(`version_moved`) and recorded in the journal (`moved:{group}` = `old->new`). A hop that
was in flight on the lost version is answered by the failure rules as a hop nobody
answered (its timeout). Why move rather than fail: the pinned version is gone for good,
so failing would turn one crashed replica into failed requests; the move is visible
where the request's story is told (log, journal) instead of silent.

A group whose replicas announce no version (workers from before versions) is not
pinned: its hops go to `hooks:{group}`, which every replica reads.
"""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aredis
import structlog
from redis.exceptions import ResponseError

from hookbus.bus.connection.retrying import out_of_memory
from hookbus.bus.connection.values import text
from hookbus.bus.groups.registry import RegistryView
from hookbus.bus.groups.versions import choose_version
from hookbus.bus.keys import Keys
from hookbus.skills.errors import RedisOutOfMemory

log = structlog.get_logger("hookbus.version_pins")

# KEYS: journal. ARGV: field, candidate. The pin already in the journal, else the
# candidate (stored there when the journal exists: a request run without one keeps its
# pins in memory only).
_PIN = """
if redis.call('EXISTS', KEYS[1]) == 0 then return ARGV[2] end
local pinned = redis.call('HGET', KEYS[1], ARGV[1])
if pinned then return pinned end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return ARGV[2]
"""

# KEYS: journal. ARGV: group, old version, new version. Records a move (module docstring).
_MOVE = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'pin:' .. ARGV[1], ARGV[3], 'moved:' .. ARGV[1], ARGV[2] .. '->' .. ARGV[3])
end
return 1
"""


class VersionPins:
    def __init__(self, client: aredis.Redis, keys: Keys, registry: RegistryView) -> None:
        self.client = client
        self.keys = keys
        self.registry = registry
        self._pins: dict[str, dict[str, str]] = {}
        """completion id -> group -> the version its hops go to."""
        self._pin = client.register_script(_PIN)
        self._record_move = client.register_script(_MOVE)
        self.moved = 0

    def pinned(self, completion_id: str) -> dict[str, str]:
        return dict(self._pins.get(completion_id, {}))

    async def stream_for(self, group: str, completion_id: str, *, pin: bool = True) -> str:
        """The stream shard a hop of this request to `group` goes to. `pin=False`: a hop
        outside any request (on_compaction between turns) goes to the newest version
        without pinning anything."""
        version = await self.version_for(group, completion_id) if pin else self._choose(group)
        if version is None:
            return self.keys.hooks_for(group, completion_id)
        return self.keys.pinned_hooks_for(group, version, completion_id)

    async def version_for(self, group: str, completion_id: str) -> str | None:
        """The version this request runs `group` on, pinned at its first hop there. Redis
        refusing the pin at `maxmemory` is the request's 503 `redis_out_of_memory`, as a
        refused hop is."""
        try:
            return await self._version_for(group, completion_id)
        except ResponseError as exc:
            if out_of_memory(exc):
                raise RedisOutOfMemory() from exc
            raise

    async def _version_for(self, group: str, completion_id: str) -> str | None:
        states = self.registry.versions.get(group)
        if not states:
            return None
        pins = self._pins.setdefault(completion_id, {})
        current = pins.get(group)
        if current is not None and current in states:
            return current
        candidate = self._choose(group)
        assert candidate is not None
        if current is None:
            current = await self._first_pin(group, completion_id, candidate)
            if current in states:
                pins[group] = current
                return current
        await self._move(group, completion_id, current, candidate)
        pins[group] = candidate
        return candidate

    def _choose(self, group: str) -> str | None:
        return choose_version(self.registry.versions.get(group, {}), self.registry.rollouts.get(group))

    async def _first_pin(self, group: str, completion_id: str, candidate: str) -> str:
        """Pin in the journal (one round trip beside the `serving:` count): the journal's
        own pin if it has one (a recovered request), else `candidate`."""
        journal = self.keys.journal(completion_id)
        pinned_raw, _ = await asyncio.gather(
            self._pin(keys=[journal], args=[f"pin:{group}", candidate]),
            self.client.zadd(self.keys.serving(group, candidate), {completion_id: time.time()}),
        )
        pinned = text(pinned_raw)
        if pinned != candidate:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.zrem(self.keys.serving(group, candidate), completion_id)
                pipe.zadd(self.keys.serving(group, pinned), {completion_id: time.time()})
                await pipe.execute()
        return pinned

    async def _move(self, group: str, completion_id: str, old: str, new: str) -> None:
        """The rule for a pinned version with no replica left (module docstring)."""
        self.moved += 1
        log.warning(
            "version_moved", completion_id=completion_id, group=group, old_version=old, new_version=new,
            reason="no live replica of the pinned version",
        )
        await self._record_move(keys=[self.keys.journal(completion_id)], args=[group, old, new])
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.zrem(self.keys.serving(group, old), completion_id)
            pipe.zadd(self.keys.serving(group, new), {completion_id: time.time()})
            await pipe.execute()

    async def release(self, completion_id: str, *, ended: bool = True) -> None:
        """The request ended here: it no longer counts as served by its versions.
        `ended=False` (another orchestrator took it over and runs it on): only forget it."""
        pins = self._pins.pop(completion_id, None)
        if not pins or not ended:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            for group, version in pins.items():
                pipe.zrem(self.keys.serving(group, version), completion_id)
            await pipe.execute()
