"""The request journal: who runs a request, how far it got, and whether it was finished.

`journal:{completion_id}` (hookbus.bus.keys.Keys.journal: in the slot of the request's
requests shard, response stream and cancel marker, so each script below touches one
slot, also on a Redis Cluster) is a hash written only through the Lua scripts below, so each
step is one atomic round trip:

| field | meaning |
|---|---|
| `owner` | orchestrator instance running the request now |
| `epoch` | fencing token: "1" when a run starts; +1 each time another orchestrator claims it |
| `entry` | the `requests` entry id (another entry with the same completion id is a duplicate) |
| `stage` | the last lifecycle stage a hook ran at (`started` before any, `done` at the end) |
| `started` | unix time the first run started |
| `written` | response items stored (chunks and the terminal item; items, not entries), set by `finish`; while the run writes, the response stream's entry ids say it (`Journal.written`) |
| `terminal` | "1" once the terminal item is stored |
| `finalized` | "1" once finalize_connection ran and the terminal item is stored |
| `done` | "1" once the request entry is acked |
| `recovered` | "1" if an orchestrator other than the first one claimed it |
| `previous_owner` | who owned it before the last claim |

Every script is safe to run twice (the client retries a call whose reply was lost in a
dropped connection): `begin` recognises its own journal, `write` and `finish` skip items
already stored (by the entry's id, below), `claim` just bumps the epoch again.

Response stream entries: each `write` and `finish` stores its items as one entry of
`responses:{completion_id}`, a ResponseBatch (hookbus.bus.wire.envelopes) holding them in
order, the terminal item last (one XADD per write, not one per item). A writer that knows
how many items are stored before its batch (`first_seq`: 0 for a new run) gives the entry
the id `0-N`, N the items stored with it, so the ids grow as XADD requires; a call run again
after its reply was lost finds XADD refusing that id and the stream's last entry carrying
it, and stores nothing. That costs no journal write per batch (before: an HSET of the count
in every batch). An entry the writer did not number on top of the stream (one XADD `*` put
there, which only a misuse of the completion id does) makes it append after it, with `*`;
a new owner after a takeover (which writes only the terminal item, first_seq -1) appends
with `*` too, after every numbered entry, so it neither repeats nor drops an item.
Readers also read entries of one bare ResponseItem (writers before batching, and the
orchestrator's refusals of bad requests); a reader from before batching skips batch
entries, so upgrade gateways and clients before orchestrators.

Fencing: every response write and the final ack go through a script that first checks
that the journal's `epoch` is still the writer's. An owner that stalled and lost the
request (another orchestrator claimed it and bumped the epoch) finds out at its next
write or lease renewal and stops; it never writes after the claim.

A journal that is gone is not another owner's claim: a claim bumps the epoch of a journal
that exists (or makes a fresh one). It is gone when Redis lost its data (restarted without
persistence, or the journal's write fell in the AOF's last second) under a request that
still runs: `write` and the lease renewal say LOST (-2) rather than FENCED, so the owner
ends the run with an error and finalizes it itself (its request entry, if Redis lost that
too, is on no other orchestrator's list), and `finish` stores the terminal item and marks
a new journal done (`lost`), so a copy of the entry delivered again is refused, not run.

Cost on a request's path: `begin` is one round trip at the start (it also reads the
cancel marker: one EXISTS of both keys, then HSET, which also stores the request's version
pins, and EXPIRE); `finish` replaces the two
round trips a request used to end with (the last response write and the XACK) by one;
each chunk batch is one round trip, whose script runs HMGET (the fence), one XADD and, for
the first batch only, the stream's EXPIRE. `finish` sets
that TTL again only when asked (the writer does not when its own first batch set it less
than half a TTL ago), and blanks the run's step fields in the HSET it runs anyway
(hookbus.bus.store.run_steps: one HSET for each LLM call, each tool call and the stages
before each is all that resuming a run costs). Lease
renewal and stage notes go in one script per orchestrator every few seconds, for all its
requests together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import redis
import redis.asyncio as aredis

from hookbus.bus.connection.values import text
from hookbus.bus.keys import Keys
from hookbus.bus.wire.envelopes import ResponseItem, encode_response_batch

JOURNAL_TTL = 6 * 3600
"""While a request runs (renewed with its lease)."""
DONE_TTL = 600
"""After the request was acked: long enough to refuse a late duplicate and to inspect."""

FENCED = -1
LOST = -2
"""What `write` returns when the journal is gone: Redis lost the request's state."""

_BEGIN = """
local cancelled = 0
-- one EXISTS for both keys: a new journal with no cancel marker, the common case, is 0
if redis.call('EXISTS', KEYS[1], KEYS[2]) > 0 then
  cancelled = redis.call('EXISTS', KEYS[2])
  local j = redis.call('HMGET', KEYS[1], 'entry', 'done', 'owner', 'epoch', 'recovered')
  if j[4] then
    if j[1] == ARGV[2] and j[3] == ARGV[1] and j[4] == '1' and not j[5] and j[2] ~= '1' then
      -- our own begin, run again by the client's retry after its reply was lost
      return {1, ARGV[2], '0', ARGV[1], '1', cancelled}
    end
    return {0, j[1] or '', j[2] or '0', j[3] or '', j[4] or '0', cancelled}
  end
end
-- ARGV[5..]: the caller's own fields (field, value, ...), the version pins
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'epoch', '1', 'entry', ARGV[2],
  'stage', 'started', 'started', ARGV[4], 'written', '0', unpack(ARGV, 5))
redis.call('EXPIRE', KEYS[1], ARGV[3])
return {1, ARGV[2], '0', ARGV[1], '1', cancelled}
"""

_CLAIM = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'epoch', '1', 'entry', ARGV[2],
    'stage', 'started', 'started', ARGV[4], 'written', '0', 'recovered', '1')
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  return {'fresh', '1', '0', 'started', '0'}
end
local j = redis.call('HMGET', KEYS[1], 'entry', 'done', 'finalized', 'stage', 'terminal', 'owner')
if j[1] ~= ARGV[2] then return {'duplicate', '0', j[3] or '0', j[4] or '', j[5] or '0'} end
if j[2] == '1' then return {'done', '0', j[3] or '0', j[4] or '', j[5] or '0'} end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'recovered', '1', 'previous_owner', j[6] or '')
redis.call('EXPIRE', KEYS[1], ARGV[3])
return {'claimed', tostring(epoch), j[3] or '0', j[4] or '', j[5] or '0'}
"""

# KEYS: journal, responses. ARGV: epoch, ttl, first_seq, item count, batch entry.
# first_seq >= 0 makes a retried batch idempotent through the entry's id (module docstring):
# XADD refuses an id at or below the stream's last one, and the last one is this batch's own
# when the call that stored it lost its reply.
_WRITE = """
local j = redis.call('HMGET', KEYS[1], 'epoch', 'terminal')
if not j[1] then return -2 end
if j[1] ~= ARGV[1] or j[2] == '1' then return -1 end
local first = tonumber(ARGV[3])
if first < 0 then
  redis.call('XADD', KEYS[2], '*', 'e', ARGV[5])
  return 0
end
local written = first + tonumber(ARGV[4])
local id = '0-' .. written
local stored = redis.pcall('XADD', KEYS[2], id, 'e', ARGV[5])
if type(stored) == 'table' and stored.err then
  local top = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
  if top[1] and top[1][1] == id then return written end
  -- an entry this writer did not number is on top: append after it
  redis.call('XADD', KEYS[2], '*', 'e', ARGV[5])
end
-- the TTL is set by the first batch and renewed by `finish`, not once per batch
if first == 0 then redis.call('EXPIRE', KEYS[2], ARGV[2]) end
return written
"""

# KEYS: journal, responses, requests. ARGV: epoch, ttl, first_seq, group, entry, done_ttl,
# item count, renew the TTL ("1" or "0"), batch entry (its last item terminal), then the
# run's step fields (hookbus.bus.store.run_steps), blanked in the HSET that marks it done.
# Idempotent: a retry after a lost reply only acks again. A journal that is gone (Redis
# lost it): the terminal item is stored, the entry acked if Redis still has it, and a done
# journal written in its place.
_FINISH = """
local j = redis.call('HMGET', KEYS[1], 'epoch', 'written', 'terminal')
if not j[1] then
  redis.call('XADD', KEYS[2], '*', 'e', ARGV[9])
  redis.call('EXPIRE', KEYS[2], ARGV[2])
  redis.pcall('XACK', KEYS[3], ARGV[4], ARGV[5])
  redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'entry', ARGV[5], 'written', ARGV[7], 'terminal', '1',
    'finalized', '1', 'done', '1', 'stage', 'done', 'lost', '1')
  redis.call('EXPIRE', KEYS[1], ARGV[6])
  return tonumber(ARGV[7])
end
if j[1] ~= ARGV[1] then return -1 end
local written = tonumber(j[2] or '0')
if j[3] ~= '1' then
  local first = tonumber(ARGV[3])
  if first >= 0 then
    written = first + tonumber(ARGV[7])
    local stored = redis.pcall('XADD', KEYS[2], '0-' .. written, 'e', ARGV[9])
    -- an entry this writer did not number is on top: append after it
    if type(stored) == 'table' and stored.err then redis.call('XADD', KEYS[2], '*', 'e', ARGV[9]) end
  else
    -- a recovery's terminal item: the count is in the id of the last numbered entry
    local top = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
    if top[1] then
      local ms, seq = string.match(top[1][1], '^(%d+)-(%d+)$')
      if ms == '0' then written = tonumber(seq) end
    end
    written = written + tonumber(ARGV[7])
    redis.call('XADD', KEYS[2], '*', 'e', ARGV[9])
  end
  if ARGV[8] == '1' then redis.call('EXPIRE', KEYS[2], ARGV[2]) end
end
redis.call('XACK', KEYS[3], ARGV[4], ARGV[5])
local done = {'written', written, 'terminal', '1', 'finalized', '1', 'done', '1', 'stage', 'done'}
for i = 10, #ARGV do
  done[#done + 1] = ARGV[i]
  done[#done + 1] = ''
end
redis.call('HSET', KEYS[1], unpack(done))
redis.call('EXPIRE', KEYS[1], ARGV[6])
return written
"""

# KEYS: requests, then (journal, cancel marker) per request. ARGV: group, consumer, ttl,
# then (entry, epoch, stage) per request. Returns {fenced entries, cancelled entries, lost
# entries (their journal is gone), cancelled entries whose client stalled}.
_RENEW = """
local fenced, cancelled, lost, stalled = {}, {}, {}, {}
local n = (#KEYS - 1) / 2
for i = 1, n do
  local journal, marker = KEYS[2 * i], KEYS[2 * i + 1]
  local base = 4 + (i - 1) * 3
  local entry, epoch, stage = ARGV[base], ARGV[base + 1], ARGV[base + 2]
  local j = redis.call('HMGET', journal, 'epoch', 'done')
  if not j[1] then
    lost[#lost + 1] = entry
  elseif j[1] ~= epoch then
    fenced[#fenced + 1] = entry
  elseif j[2] ~= '1' then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, entry, 'JUSTID')
    redis.call('EXPIRE', journal, ARGV[3])
    if stage ~= '' then redis.call('HSET', journal, 'stage', stage) end
    local why = redis.call('GET', marker)
    if why then cancelled[#cancelled + 1] = entry end
    if why == 'client_stalled' then stalled[#stalled + 1] = entry end
  end
end
return {fenced, cancelled, lost, stalled}
"""


@dataclass(frozen=True)
class Begun:
    """What `Journal.begin` found: `ok` means this call created the journal (epoch 1)."""

    ok: bool
    entry: str
    done: bool
    owner: str
    epoch: int
    cancelled: bool


@dataclass(frozen=True)
class Claim:
    """What `Journal.claim` found.

    `outcome`: `fresh` (nobody had started it: run it), `claimed` (it was started and its
    owner is gone: finalize it), `done` (it was finished: only ack), `duplicate` (the
    journal belongs to another request entry with the same completion id).
    """

    outcome: str
    epoch: int
    finalized: bool
    stage: str
    terminal: bool


@dataclass(frozen=True)
class Lease:
    """One running request as the lease renewal sees it."""

    entry_id: str
    completion_id: str
    epoch: int
    stage: str = ""
    stream: str | None = None
    """The requests stream shard it was read from (an agent's); None: the unnamed one."""


@dataclass
class Renewal:
    """What one lease renewal found: leases fenced out (a peer claimed them), cancelled
    (a cancel marker), and lost (the journal is gone: Redis lost the request's state)."""

    fenced: list[Lease] = field(default_factory=list)
    cancelled: list[Lease] = field(default_factory=list)
    lost: list[Lease] = field(default_factory=list)
    stalled: list[Lease] = field(default_factory=list)
    """Of the cancelled, those whose client stopped reading (the marker says `client_stalled`)."""


class Leases:
    """Lease renewal through a synchronous client, for the liveness thread
    (bus/liveness.py): a busy event loop cannot hold it up, so a busy owner keeps its
    requests."""

    def __init__(self, client: redis.Redis, keys: Keys, *, ttl: int = JOURNAL_TTL) -> None:
        self.keys = keys
        self.ttl = ttl
        self._renew = client.register_script(_RENEW)

    def renew(self, group: str, consumer: str, leases: Sequence[Lease]) -> Renewal:
        """Renew the claim on every running request still ours (XCLAIM JUSTID), refresh
        their journals' TTL and stage; says which leases were fenced out, cancelled, or
        lost (their journal gone with Redis's data).

        One script per requests stream shard (a script touches one slot, and an agent's
        stream shard shares the slot of the unnamed one)."""
        by_stream: dict[str, list[Lease]] = {}
        for lease in leases:
            stream = lease.stream or self.keys.requests_for(lease.completion_id)
            by_stream.setdefault(stream, []).append(lease)
        renewal = Renewal()
        for stream, batch in by_stream.items():
            keys: list[str] = [stream]
            args: list[str | int] = [group, consumer, self.ttl]
            for lease in batch:
                keys += [self.keys.journal(lease.completion_id), self.keys.cancel(lease.completion_id)]
                args += [lease.entry_id, lease.epoch, lease.stage]
            shard_fenced, shard_cancelled, shard_lost, shard_stalled = self._renew(keys=keys, args=args)
            by_entry = {lease.entry_id: lease for lease in batch}
            renewal.fenced += [by_entry[text(e)] for e in shard_fenced]
            renewal.cancelled += [by_entry[text(e)] for e in shard_cancelled]
            renewal.lost += [by_entry[text(e)] for e in shard_lost]
            renewal.stalled += [by_entry[text(e)] for e in shard_stalled]
        return renewal


class Journal:
    """The journal scripts, bound to one client and key layout."""

    def __init__(
        self,
        client: aredis.Redis,
        keys: Keys,
        *,
        ttl: int = JOURNAL_TTL,
        done_ttl: int = DONE_TTL,
    ) -> None:
        self.client = client
        self.keys = keys
        self.ttl = ttl
        self.done_ttl = done_ttl
        self._begin = client.register_script(_BEGIN)
        self._claim = client.register_script(_CLAIM)
        self._write = client.register_script(_WRITE)
        self._finish = client.register_script(_FINISH)

    def key(self, completion_id: str) -> str:
        return self.keys.journal(completion_id)

    async def begin(
        self, completion_id: str, entry_id: str, owner: str, *, now: float, fields: Mapping[str, str] | None = None
    ) -> Begun:
        """Create the journal for a first run (and read the cancel marker); if one
        exists, say whose it is instead. `fields`: more fields of the new journal (the
        request's version pins: hookbus.services.orchestrator.serving.version_pins)."""
        keys = [self.key(completion_id), self.keys.cancel(completion_id)]
        extra = [x for pair in (fields or {}).items() for x in pair]
        raw = await self._begin(keys=keys, args=[owner, entry_id, self.ttl, repr(now), *extra])
        ok, entry, done, who, epoch, cancelled = raw
        return Begun(
            ok=int(ok) == 1, entry=text(entry), done=text(done) == "1", owner=text(who),
            epoch=int(text(epoch) or 0), cancelled=int(cancelled) == 1,
        )

    async def claim(self, completion_id: str, entry_id: str, owner: str, *, now: float) -> Claim:
        """Take a request over from a lost owner: bumps the epoch (fencing the old owner out)."""
        raw = await self._claim(
            keys=[self.key(completion_id)], args=[owner, entry_id, self.ttl, repr(now)]
        )
        outcome, epoch, finalized, stage, terminal = (text(v) for v in raw)
        return Claim(outcome, int(epoch or 0), finalized == "1", stage, terminal == "1")

    async def write(
        self,
        completion_id: str,
        responses: str,
        epoch: int,
        items: Sequence[ResponseItem],
        *,
        ttl: int,
        first_seq: int = -1,
    ) -> int:
        """Append response items, as one batch entry, if `epoch` still owns the request;
        FENCED (-1) if not, LOST (-2) if the journal is gone.

        Returns the count of items written, this batch's included (`first_seq` plus its
        items; 0 when `first_seq` is -1)."""
        return int(
            await self._write(
                keys=[self.key(completion_id), responses],
                args=[epoch, ttl, first_seq, len(items), encode_response_batch(list(items))],
            )
        )

    async def finish(
        self,
        completion_id: str,
        responses: str,
        epoch: int,
        items: Sequence[ResponseItem],
        *,
        ttl: int,
        requests: str,
        group: str,
        entry_id: str,
        first_seq: int = -1,
        renew_ttl: bool = True,
        steps: Sequence[str] = (),
    ) -> int:
        """Store the last items as one batch entry (the terminal one last, unless a
        terminal item is already stored), ack the request entry and mark the journal
        done, if `epoch` still owns the request; FENCED (-1) if not. A journal that is gone
        is rewritten as done (see the module docstring: LOST).

        `renew_ttl=False` leaves the response stream's TTL as it is: only for a caller
        that knows its first batch set it recently (hookbus.bus.store.response_stream).
        `steps`: the run's step fields (hookbus.bus.store.run_steps), blanked."""
        return int(
            await self._finish(
                keys=[self.key(completion_id), responses, requests],
                args=[
                    epoch, ttl, first_seq, group, entry_id, self.done_ttl, len(items),
                    int(renew_ttl), encode_response_batch(list(items)), *steps,
                ],
            )
        )

    async def read(self, completion_id: str) -> dict[str, str]:
        raw = await self.client.hgetall(self.key(completion_id))
        return {text(k): text(v) for k, v in raw.items()}

    async def written(self, completion_id: str) -> int:
        """Response items a run stored so far: the number in the id of the response
        stream's last numbered entry (module docstring), or the journal's `written` once
        the request finished (the client deletes the stream at the terminal item)."""
        top = await self.client.xrevrange(self.keys.responses(completion_id), count=1)
        if top:
            ms, seq = text(top[0][0]).split("-")
            if ms == "0":
                return int(seq)
        return int((await self.read(completion_id)).get("written", 0))
