"""Keeping streams bounded without ever losing an entry that is not acknowledged.

- `requests` and `hooks:{group}`: a janitor in the orchestrators (for `requests`) and in
  the workers (for their group's stream) calls `trim_acked` every `TRIM_EVERY` seconds.
  It trims with XTRIM MINID up to the oldest entry that some consumer group of the
  stream still needs: its oldest pending entry, or the first entry after its
  last-delivered id. One Lua script reads the groups and trims, atomically, so an entry
  delivered or acked meanwhile cannot be lost. A stream with no consumer group is
  never trimmed (nobody has read anything yet).
- `observe:{group}`: trimmed the same way by its replicas, and kept within a bound in
  entries and bytes by the orchestrators, whose drops are counted
  (hookbus.bus.groups.observer_backlog).
- `responses:{completion_id}` expire (hookbus.bus.store.response_stream.RESPONSE_TTL) and are deleted by the
  client once it read the terminal item; `journal:{completion_id}` expire
  (hookbus.bus.store.journal).
- `events` and `dead-letter` are capped by MAXLEN on every write.
- `replies:{instance}` are trimmed by their reader (hookbus.bus.hops.reply_router) of what
  it read: every 256 replies or 1 MiB of them, and once no hop waited for a second, so an
  idle orchestrator keeps no reply, however large; the janitor deletes
  those of orchestrators gone for `FORGET_AFTER`, and forgets their heartbeats and their
  consumer names once they hold no pending entry (`prune_consumers`).
"""

from __future__ import annotations

import time

import redis.asyncio as aredis

from hookbus.bus.connection.values import text

TRIM_EVERY = 30.0
FORGET_AFTER = 600.0

TRIM_ACKED_LUA = """
local function trim_acked(key)
  if redis.call('EXISTS', key) == 0 then return 0, '' end
  local groups = redis.call('XINFO', 'GROUPS', key)
  if #groups == 0 then return 0, '' end
  local function parse(id)
    local dash = string.find(id, '-', 1, true)
    return tonumber(string.sub(id, 1, dash - 1)), tonumber(string.sub(id, dash + 1))
  end
  local best_ms, best_seq = nil, nil
  for _, g in ipairs(groups) do
    local info = {}
    for k = 1, #g, 2 do info[g[k]] = g[k + 1] end
    local ms, seq
    if tonumber(info['pending']) > 0 then
      local summary = redis.call('XPENDING', key, info['name'])
      ms, seq = parse(summary[2])
    else
      ms, seq = parse(info['last-delivered-id'])
      seq = seq + 1
    end
    if best_ms == nil or ms < best_ms or (ms == best_ms and seq < best_seq) then
      best_ms, best_seq = ms, seq
    end
  end
  local minid = string.format('%d-%d', best_ms, best_seq)
  return redis.call('XTRIM', key, 'MINID', minid), minid
end
"""
"""A Lua function `trim_acked(key)` -> (entries removed, MINID or ""): the trim of
`trim_acked` below, for the scripts that trim more (hookbus.bus.groups.observer_backlog)."""

TRIM_LUA = TRIM_ACKED_LUA + """
local removed, minid = trim_acked(KEYS[1])
return {removed, minid}
"""
"""KEYS[1] a stream -> {entries removed, MINID or ""}. Every worker runs this one text
(the protocol spec's `constants.scripts`: the TypeScript worker reads it from there)."""

PRUNE_LUA = """
local consumers = redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
local pending = {}
for _, c in ipairs(consumers) do
  local info = {}
  for k = 1, #c, 2 do info[c[k]] = c[k + 1] end
  pending[info['name']] = tonumber(info['pending'])
end
local removed = 0
for i = 2, #ARGV do
  if pending[ARGV[i]] == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[i])
    removed = removed + 1
  end
end
return removed
"""
"""KEYS[1] a stream; ARGV: its group, then consumers to forget if they hold nothing ->
how many were forgotten (in the spec beside TRIM_LUA)."""


async def trim_acked(client: aredis.Redis, stream: str) -> tuple[int, str]:
    """Trim what every consumer group of `stream` has acknowledged; (entries removed,
    the MINID used or "" when nothing could be trimmed)."""
    removed, minid = await client.eval(TRIM_LUA, 1, stream)
    return int(removed), text(minid)


async def delete_consumer_if_idle(client: aredis.Redis, stream: str, group: str, consumer: str) -> bool:
    """XGROUP DELCONSUMER `consumer`, atomically only if it holds no pending entry (a
    replica leaving after its drain: nothing of it is left for a lease to expire)."""
    try:
        return int(await client.eval(PRUNE_LUA, 1, stream, group, consumer)) == 1
    except aredis.ResponseError:
        return False  # no such stream or group


async def prune_consumers(
    client: aredis.Redis,
    stream: str,
    group: str,
    heartbeats: str,
    *,
    forget_after: float = FORGET_AFTER,
) -> int:
    """Forget consumers of `group` whose heartbeat is older than `forget_after` (or who
    have none) and who hold no pending entry; drop their old heartbeats too."""
    try:
        consumers = await client.xinfo_consumers(stream, group)
    except aredis.ResponseError:
        return 0  # no such stream or group yet
    names = [text(c["name"]) for c in consumers]
    if not names:
        return 0
    scores = await client.zmscore(heartbeats, names)
    cutoff = time.time() - forget_after
    gone = [n for n, s in zip(names, scores, strict=True) if s is None or float(s) < cutoff]
    removed = 0
    if gone:
        removed = int(await client.eval(PRUNE_LUA, 1, stream, group, *gone))
    await client.zremrangebyscore(heartbeats, "-inf", cutoff)
    return removed
