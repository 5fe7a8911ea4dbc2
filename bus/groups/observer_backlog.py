"""Each observer group's backlog within a bound: `observe:{group}` holds at most
`max_entries` entries and `max_bytes` bytes; past either, its oldest observations are
dropped, counted and logged.

Observers get a request's stages at least once and no request waits for them
(hookbus.bus.wire.observations), so nothing slows the requests when a group's replicas
stop or fall behind: its stream grows instead, until Redis is full and refuses every
write. The bound makes a stopped group lose its oldest observations rather than the bus
its memory. The orchestrators enforce it (they write the observations, and run whether or
not the group has a replica): every `CHECK_EVERY` seconds, for each announced group with
an observer hook and each shard of its stream, one script, atomically,

1. trims what the group acknowledged (hookbus.bus.groups.trim: never a pending entry);
2. only if the stream is still over either bound, trims its oldest entries, pending or
   not yet read, until it is within both (over its bytes: down to BYTES_HEADROOM below
   them), and acknowledges the trimmed ones in the group's pending list (no replica
   claims an entry that is gone);

and what step 2 removed is added to the `observe-dropped` hash (entries and bytes per
group; `hookbus status`, the gateway's `/metrics` and the console show it) and logged
(`observations_dropped`). A group within its bound loses nothing, whether or not it has
replicas. Checks cost a few commands per group and shard every CHECK_EVERY seconds in
each orchestrator, nothing per request.

Bytes are the stream's memory as Redis counts it (MEMORY USAGE ... SAMPLES 0: its entries
and its consumer group's pending list). The bound of a group is split evenly over the
shards of its stream. Between two checks a stream can pass its bound by what the
orchestrators append in CHECK_EVERY seconds: that is the slack.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import redis.asyncio as aredis
import structlog
from pydantic import BaseModel, Field

from hookbus.bus.connection.values import text
from hookbus.bus.groups.trim import TRIM_ACKED_LUA
from hookbus.bus.keys import Keys

log = structlog.get_logger("hookbus.observer_backlog")

CHECK_EVERY = 5.0
"""Seconds between two checks of the observer streams by one orchestrator."""
BYTES_HEADROOM = 0.1
"""A stream over its bytes is trimmed to this share below them: a replica reading what is
kept adds its pending list to the stream's memory, which must not push it over at once."""
BYTES_SUFFIX = ":bytes"
"""The `observe-dropped` field of a group's dropped bytes is the group's name with this after it."""

# KEYS[1] the stream; ARGV[1] max entries, ARGV[2] max bytes, ARGV[3] the bytes a trim for bytes goes down to.
# -> {dropped entries, dropped bytes, entries kept, bytes kept}
_BOUND = TRIM_ACKED_LUA + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0, 0, 0} end
trim_acked(KEYS[1])
local max_entries, max_bytes, down_to = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local entries = redis.call('XLEN', KEYS[1])
local bytes = redis.call('MEMORY', 'USAGE', KEYS[1], 'SAMPLES', '0')
if entries <= max_entries and bytes <= max_bytes then return {0, 0, entries, bytes} end
local before, dropped = bytes, 0
local keep = math.min(entries, max_entries)
local target = max_bytes
if bytes > max_bytes then target = down_to end
while entries > 0 do
  if bytes > target then
    keep = math.min(keep, entries - 1, math.floor(entries * target / bytes))
  end
  dropped = dropped + redis.call('XTRIM', KEYS[1], 'MAXLEN', keep)
  entries = redis.call('XLEN', KEYS[1])
  bytes = redis.call('MEMORY', 'USAGE', KEYS[1], 'SAMPLES', '0')
  if bytes <= target then break end
end
local oldest = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
local gone_before = '+'
if #oldest > 0 then gone_before = '(' .. oldest[1][1] end
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name
  for k = 1, #g, 2 do if g[k] == 'name' then name = g[k + 1] end end
  repeat
    local gone = redis.call('XPENDING', KEYS[1], name, '-', gone_before, 1000)
    local ids = {}
    for i, p in ipairs(gone) do ids[i] = p[1] end
    if #ids > 0 then redis.call('XACK', KEYS[1], name, unpack(ids)) end
  until #gone < 1000
end
bytes = redis.call('MEMORY', 'USAGE', KEYS[1], 'SAMPLES', '0')
return {dropped, math.max(before - bytes, 0), entries, bytes}
"""


class BacklogBound(BaseModel):
    """What one observer group's stream may hold (over all its shards)."""

    max_entries: int = Field(gt=0)
    max_bytes: int = Field(gt=0)

    def per_shard(self, shards: int) -> BacklogBound:
        return BacklogBound(max_entries=max(1, self.max_entries // shards), max_bytes=max(1, self.max_bytes // shards))


class Bounded(NamedTuple):
    """One check of one stream: what it dropped, and what it holds after."""

    dropped: int
    dropped_bytes: int
    entries: int
    bytes: int


class ObserverDrops(BaseModel):
    """What the bound dropped of one group's observations, since the count began."""

    entries: int = 0
    bytes: int = 0


async def bound_stream(client: aredis.Redis, stream: str, bound: BacklogBound) -> Bounded:
    """Trim what `stream`'s group acked, then its oldest entries while over `bound` (one script)."""
    down_to = int(bound.max_bytes * (1 - BYTES_HEADROOM))
    reply: Any = await client.eval(_BOUND, 1, stream, bound.max_entries, bound.max_bytes, down_to)
    return Bounded(*(int(value) for value in reply))


async def bound_observer_backlogs(
    client: aredis.Redis, keys: Keys, groups: list[str], bound: BacklogBound
) -> dict[str, ObserverDrops]:
    """Bound the observer stream of each of `groups`; what was dropped now, by group (the
    groups that dropped nothing are left out). Counted in `keys.observe_dropped`, logged."""
    per_shard = bound.per_shard(keys.shards)
    dropped: dict[str, ObserverDrops] = {}
    for group in groups:
        for stream in keys.observe_streams(group):
            done = await bound_stream(client, stream, per_shard)
            if not done.dropped:
                continue
            drops = dropped.setdefault(group, ObserverDrops())
            drops.entries += done.dropped
            drops.bytes += done.dropped_bytes
            log.warning(
                "observations_dropped", group=group, stream=stream, dropped=done.dropped,
                dropped_bytes=done.dropped_bytes, kept=done.entries, kept_bytes=done.bytes,
                max_entries=per_shard.max_entries, max_bytes=per_shard.max_bytes,
                hint="the group's observers are stopped or slower than the requests: its oldest observations go",
            )
    if dropped:
        async with client.pipeline(transaction=False) as pipe:
            for group, drops in dropped.items():
                pipe.hincrby(keys.observe_dropped, group, drops.entries)
                pipe.hincrby(keys.observe_dropped, group + BYTES_SUFFIX, drops.bytes)
            await pipe.execute()
    return dropped


async def read_drops(client: aredis.Redis, keys: Keys) -> dict[str, ObserverDrops]:
    """Every group's drops since the count began (one HGETALL)."""
    fields: Any = await client.hgetall(keys.observe_dropped)
    drops: dict[str, ObserverDrops] = {}
    for raw_name, raw_value in fields.items():
        name, value = text(raw_name), int(raw_value)
        if name.endswith(BYTES_SUFFIX):
            drops.setdefault(name.removesuffix(BYTES_SUFFIX), ObserverDrops()).bytes = value
        else:
            drops.setdefault(name, ObserverDrops()).entries = value
    return drops
