"""Which version of each worker group a request runs on (hookbus.bus.groups.versions).

When a request starts, the version of every group with versions is chosen
(`choose_version`: the newest version taking new requests, or the canary for its share)
and pinned: in this process, and in the request's journal (fields `pin:{group}`, written
by the journal's `begin` with the rest of the new journal, so pinning costs no command of
its own; an orchestrator that recovers the request keeps them: the journal's pin wins over
a new choice). Every hop of the request to that group goes to the pinned version's stream,
`hooks:{group}@{version}`, and so does a stage a worker sends on. A group that gets
versions after the request started is pinned at the request's first hop to it, with the
groups of that hop's route (`pin`: one journal script for all of them).

`serving:{group}@{version}` counts the requests pinned to each version, for `hookbus status`
and for the last replica of a version, which waits for it to reach zero before it leaves
(hookbus.services.worker.drain). This process does not write it per request: every
`PUBLISH_EVERY` seconds one pipeline adds the requests pinned since the last round and
removes those that ended, and every `RESTAMP_EVERY` seconds it stamps every request still
running again, so a count includes only pins stamped within `PIN_STALE` (an orchestrator
that died stops being counted). What that costs a drain: a pin is seen up to
`PUBLISH_EVERY` seconds late, which the drain's settling time allows for. Before, each
request paid a ZADD and a ZREM per group (4 of the cost bench's 53 commands a request).

The rule when no replica of the pinned version is left (each one crashed, or left
after its drain limit): the request moves to the version `choose_version` picks, at its
next hop to that group (a stage boundary: a hop is never split over versions), logged
(`version_moved`) and recorded in the journal (`moved:{group}` = `old->new`). A hop that
was in flight on the lost version is taken back as soon as the version is seen gone (the
registry's look at the replicas after their heartbeats lapsed, `lost_hops`), not when it
times out: the orchestrator sends it again, whole, and that is the request's move (its
deadline counts from then). No replica of the lost version answers it any more: the
replica holding it died, and an entry pending at a dead consumer of a version is claimed
only by that version's replicas, none of which is left. A version whose last replica
left after draining is not lost that way: the replica finishes the hops it holds. Before, such a hop waited for its
timeout (30 s a hook, times the chunks of a batched on_chunk hop: streams stood still
for 90 s, or until the old version came back). A hop a worker sent on to the lost
version (a route) is not the orchestrator's to send again (the data it carries is the
worker's): it counts as unanswered at once. Why move rather than fail: the pinned
version is gone for good, so failing would turn one crashed replica into failed
requests; the move is visible where the request's story is told (log, journal) instead
of silent.

A group whose replicas announce no version (workers from before versions) is not
pinned: its hops go to `hooks:{group}`, which every replica reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

import redis.asyncio as aredis
import structlog
from redis.exceptions import ResponseError

from hookbus.bus.connection.retrying import RECONNECT_ERRORS, out_of_memory
from hookbus.bus.connection.values import text
from hookbus.bus.groups.periodic import cancel_and_wait, repeat
from hookbus.bus.groups.registry import RegistryView
from hookbus.bus.groups.versions import PIN_STALE, PUBLISH_EVERY, RESTAMP_EVERY, choose_version
from hookbus.bus.keys import Keys
from hookbus.skills.errors import RedisOutOfMemory

log = structlog.get_logger("hookbus.version_pins")

PIN_FIELD = "pin:"
"""A pin's field in the journal: `pin:{group}` = version."""

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
        self._added: dict[tuple[str, str], set[str]] = {}
        """(group, version) -> requests pinned there since the last publication."""
        self._ended: dict[tuple[str, str], set[str]] = {}
        """(group, version) -> requests that ended there (or moved away) since then."""
        self._restamped = time.monotonic()
        self._publisher: asyncio.Task[None] | None = None
        self._in_flight: dict[str, tuple[str, str]] = {}
        """hop id -> (group, version) of each hop waiting for a pinned version's reply."""
        self._drained: set[tuple[str, str]] = set()
        """(group, version) whose every replica was draining when last seen."""

    def pinned(self, completion_id: str) -> dict[str, str]:
        return dict(self._pins.get(completion_id, {}))

    def choose_all(self) -> dict[str, str]:
        """The version of every group with versions that a request starting now is
        pinned to: the journal fields `pin:{group}` that `begin` writes."""
        chosen = {group: self._choose(group) for group in self.registry.versions}
        return {f"{PIN_FIELD}{group}": version for group, version in chosen.items() if version is not None}

    def adopt(self, completion_id: str, fields: dict[str, str]) -> None:
        """The pins `begin` stored in the request's new journal (`choose_all`)."""
        pins = {name.removeprefix(PIN_FIELD): version for name, version in fields.items()}
        if pins:
            self._pins.setdefault(completion_id, {}).update(pins)
            for group, version in pins.items():
                self._count(completion_id, group, version)

    async def stream_for(self, group: str, completion_id: str, *, pin: bool = True) -> str:
        """The stream shard a hop of this request to `group` goes to. `pin=False`: a hop
        outside any request (on_compaction between turns) goes to the newest version
        without pinning anything."""
        version = await self.version_for(group, completion_id) if pin else self._choose(group)
        if version is None:
            return self.keys.hooks_for(group, completion_id)
        return self.keys.pinned_hooks_for(group, version, completion_id)

    async def version_for(self, group: str, completion_id: str) -> str | None:
        """The version this request runs `group` on, pinned when it started (or at its
        first hop there, for a group that had no versions then)."""
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
        versions), all in one round trip to its journal. Redis refusing a pin at
        `maxmemory` is the request's 503 `redis_out_of_memory`, as a refused hop is."""
        pinned = self._pins.get(completion_id, {})
        candidates: dict[str, str] = {}
        for group in groups:
            if group not in pinned and (version := self._choose(group)) is not None:
                candidates[group] = version
        if not candidates:
            return
        try:
            raw = await self._pin(
                keys=[self.keys.journal(completion_id)],
                args=[x for g, v in candidates.items() for x in (f"{PIN_FIELD}{g}", v)],
            )
        except ResponseError as exc:
            if out_of_memory(exc):
                raise RedisOutOfMemory() from exc
            raise
        # the journal's own pin where it has one (a recovered request), else the candidate
        found = {group: text(v) for group, v in zip(candidates, raw, strict=True)}
        self._pins.setdefault(completion_id, {}).update(found)
        for group, version in found.items():
            self._count(completion_id, group, version)

    def watch(self, hop_id: str, group: str, version: str | None) -> None:
        """The hop waits for a reply from `version` of `group` (None: no version, nothing to
        watch) until `unwatch`: `lost_hops` names it once that version is gone. Two dict
        operations, not a context manager, as this is on every hop's path: 0.38 us a hop
        against 2.8-3.5 us for a generator-based context manager, timed in one run (the
        caller's whole CPU per hop is about 108 us at concurrency 32, tests/bench/RESULTS.md)."""
        if version is not None:
            self._in_flight[hop_id] = (group, version)

    def unwatch(self, hop_id: str) -> None:
        self._in_flight.pop(hop_id, None)

    def lost_hops(self) -> list[tuple[str, str]]:
        """(hop id, why) of each watched hop whose version no live replica runs any more
        while another version of its group lives (the move's condition), called after each
        look at the replicas. Not for a group with no replica at all (the version may come
        back: its hops wait for their timeouts), nor for a version last seen draining: its
        last replica left the group after its drain limit and still finishes the hops it
        holds (hookbus.services.worker.drain), so their replies come."""
        lost = []
        for hop_id, (group, version) in self._in_flight.items():
            states = self.registry.versions.get(group)
            if states and version not in states and (group, version) not in self._drained:
                lost.append((hop_id, f"no live replica of version {version} of worker group {group!r} is left"))
        for group, states in self.registry.versions.items():
            for version, state in states.items():
                if state.takes_new_requests:
                    self._drained.discard((group, version))
                else:
                    self._drained.add((group, version))
        return lost

    def _choose(self, group: str) -> str | None:
        return choose_version(self.registry.versions.get(group, {}), self.registry.rollouts.get(group))

    def _count(self, completion_id: str, group: str, version: str) -> None:
        self._added.setdefault((group, version), set()).add(completion_id)

    def _uncount(self, completion_id: str, group: str, version: str) -> None:
        self._added.get((group, version), set()).discard(completion_id)
        self._ended.setdefault((group, version), set()).add(completion_id)

    async def _move(self, group: str, completion_id: str, old: str, new: str) -> None:
        """The rule for a pinned version with no replica left (module docstring)."""
        self.moved += 1
        log.warning(
            "version_moved", completion_id=completion_id, group=group, old_version=old, new_version=new,
            reason="no live replica of the pinned version",
        )
        await self._record_move(keys=[self.keys.journal(completion_id)], args=[group, old, new])
        self._uncount(completion_id, group, old)
        self._count(completion_id, group, new)

    def release(self, completion_id: str, *, ended: bool = True) -> None:
        """The request ended here: it no longer counts as served by its versions (from
        the next publication). `ended=False` (another orchestrator took it over and runs
        it on, and counts it): only forget it."""
        pins = self._pins.pop(completion_id, None)
        if not pins:
            return
        for group, version in pins.items():
            if ended:
                self._uncount(completion_id, group, version)
            else:
                self._added.get((group, version), set()).discard(completion_id)

    async def publish(self) -> None:
        """One round of the `serving:` counts (module docstring): the pins added and
        ended since the last round, and every running request's again when it is time to
        stamp them anew (also dropping stamps older than `PIN_STALE`)."""
        now = time.time()
        restamp = time.monotonic() - self._restamped >= RESTAMP_EVERY
        added, ended = self._added, self._ended
        if restamp:
            self._restamped = time.monotonic()
            added = {}
            for cid, pins in self._pins.items():
                for group, version in pins.items():
                    added.setdefault((group, version), set()).add(cid)
        if not any(added.values()) and not any(ended.values()):
            return
        self._added, self._ended = {}, {}
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for (group, version), cids in added.items():
                    serving = self.keys.serving(group, version)
                    if cids:
                        pipe.zadd(serving, dict.fromkeys(cids, now))
                    if restamp:
                        pipe.zremrangebyscore(serving, "-inf", now - PIN_STALE)
                for (group, version), cids in ended.items():
                    if cids:
                        pipe.zrem(self.keys.serving(group, version), *cids)
                await pipe.execute()
        except BaseException:
            self._merge_back(added, ended)
            raise

    def _merge_back(self, added: dict[tuple[str, str], set[str]], ended: dict[tuple[str, str], set[str]]) -> None:
        """A round that failed is tried again with the next (a request that ended
        meanwhile stays ended)."""
        for key, cids in ended.items():
            self._ended.setdefault(key, set()).update(cids)
        for key, cids in added.items():
            live = {c for c in cids if self._pins.get(c, {}).get(key[0]) == key[1]}
            self._added.setdefault(key, set()).update(live)

    def start(self) -> None:
        """Publish the counts every `PUBLISH_EVERY` seconds until `stop`."""
        self._publisher = asyncio.create_task(
            repeat(PUBLISH_EVERY, self.publish, what="serving_counts"), name="hookbus-serving-counts"
        )

    async def stop(self) -> None:
        """Stop publishing, after one last round (the requests that ended here)."""
        task, self._publisher = self._publisher, None
        await cancel_and_wait(task)
        with contextlib.suppress(*RECONNECT_ERRORS):
            await self.publish()
