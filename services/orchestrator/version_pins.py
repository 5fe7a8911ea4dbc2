"""Which version of each worker group a request runs on (hookbus.bus.groups.versions).

At a request's first hop to a group, the version is chosen (`choose_version`: the newest
version taking new requests, or the canary for its share) and pinned: in this process,
in the request's journal (field `pin:{group}`, so that an orchestrator that recovers the
request keeps it: the journal's pin wins over a new choice), and in the version's
`serving:` count until the request ends (`release`). Every later hop of the request to
that group goes to the pinned version's stream, `hooks:{group}@{version}`, and so does
a stage a worker sends on (the route's streams are chosen here too).

The groups a hop and its route go to are pinned together (`pin`): one journal script
(HMGET, HSET) for all of them beside one pipeline of their `serving:` counts, instead of
a script and a count per group. What is pinned, and when, is the same: a route's groups
were always pinned before its first hop went out.

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
from collections.abc import Sequence

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

# KEYS: journal. ARGV: (field, candidate) per group. Per group, the pin already in the
# journal, else the candidate (stored there when the journal exists, which its `epoch`
# says: a request run without one keeps its pins in memory only).
_PIN = """
local fields = {}
for i = 1, #ARGV / 2 do fields[i] = ARGV[2 * i - 1] end
local j = redis.call('HMGET', KEYS[1], 'epoch', unpack(fields))
local pinned, new = {}, {}
for i = 1, #fields do
  local version = j[i + 1]
  if not version then
    version = ARGV[2 * i]
    new[#new + 1] = fields[i]
    new[#new + 1] = version
  end
  pinned[i] = version
end
if j[1] and #new > 0 then redis.call('HSET', KEYS[1], unpack(new)) end
return pinned
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
        """The version this request runs `group` on, pinned at its first hop there."""
        if not self.registry.versions.get(group):
            return None
        current = self._pins.get(completion_id, {}).get(group)
        if current is None:
            await self.pin([group], completion_id)
            current = self._pins.get(completion_id, {}).get(group)
        states = self.registry.versions.get(group)
        if current is None or not states:  # its versions left while the pin was stored
            return None
        if current in states:
            return current
        candidate = self._choose(group)
        assert candidate is not None
        await self._move(group, completion_id, current, candidate)
        self._pins[completion_id][group] = candidate
        return candidate

    async def pin(self, groups: Sequence[str], completion_id: str) -> None:
        """Pin the request in each of `groups` it is not pinned in yet (those that have
        versions), all in one round trip to its journal beside one to their `serving:`
        counts. Redis refusing a pin at `maxmemory` is the request's 503
        `redis_out_of_memory`, as a refused hop is."""
        pinned = self._pins.get(completion_id, {})
        candidates: dict[str, str] = {}
        for group in groups:
            if group not in pinned and (version := self._choose(group)) is not None:
                candidates[group] = version
        if not candidates:
            return
        try:
            found = await self._first_pins(candidates, completion_id)
        except ResponseError as exc:
            if out_of_memory(exc):
                raise RedisOutOfMemory() from exc
            raise
        self._pins.setdefault(completion_id, {}).update(found)

    def _choose(self, group: str) -> str | None:
        return choose_version(self.registry.versions.get(group, {}), self.registry.rollouts.get(group))

    async def _first_pins(self, candidates: dict[str, str], completion_id: str) -> dict[str, str]:
        """Pin in the journal (one script for every group, beside one pipeline of the
        `serving:` counts): the journal's own pin where it has one (a recovered request),
        else the candidate."""
        journal = self.keys.journal(completion_id)
        now = time.time()

        async def count() -> None:
            async with self.client.pipeline(transaction=False) as pipe:
                for group, version in candidates.items():
                    pipe.zadd(self.keys.serving(group, version), {completion_id: now})
                await pipe.execute()

        pinned_raw, _ = await asyncio.gather(
            self._pin(keys=[journal], args=[x for g, v in candidates.items() for x in (f"pin:{g}", v)]), count()
        )
        pinned = {group: text(v) for group, v in zip(candidates, pinned_raw, strict=True)}
        differ = {g: v for g, v in pinned.items() if v != candidates[g]}
        if differ:
            async with self.client.pipeline(transaction=False) as pipe:
                for group, version in differ.items():
                    pipe.zrem(self.keys.serving(group, candidates[group]), completion_id)
                    pipe.zadd(self.keys.serving(group, version), {completion_id: now})
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
