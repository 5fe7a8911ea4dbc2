"""`hookbus monitor` and `hookbus status`: what the bus is doing, read from Redis.

The monitor follows the `events` firehose (one record per hop, stage segment and
request; an entry holds the records of one writer's flush, hookbus.bus.store.events); status reads the registry, heartbeats and consumer-group counters.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import redis.asyncio as aredis
from pydantic import BaseModel, Field

from hookbus.bus.connection.cluster import latest_ids, xread_streams
from hookbus.bus.connection.values import text
from hookbus.bus.groups.observer_backlog import ObserverDrops, read_drops
from hookbus.bus.groups.registry import REPLICA_TTL, GroupAnnouncement, replica_protocols
from hookbus.bus.groups.served_agents import AgentsView
from hookbus.bus.keys import ORCHESTRATOR_GROUP, Keys
from hookbus.bus.wire.envelopes import DecodeError, MonitorRecord, monitor_records
from hookbus.bus.wire.protocol_version import refusal
from hookbus.services.cli.version_status import VersionStatus, format_versions, read_versions
from hookbus.services.console import request_link

LAG_SCAN_LIMIT = 10_000
RECENT_PAGE = 500
"""Entries per XREVRANGE while collecting the newest records."""


@dataclass
class EventFilter:
    completion_id: str | None = None
    lifecycle: str | None = None
    group: str | None = None
    errors_only: bool = False
    agent: str | None = None
    """Only this agent's requests: a request's start record names its agent, and its
    later records (stages, hops, its end) are known by its completion id from then on."""
    _of_agent: set[str] = field(default_factory=set)

    def matches(self, record: MonitorRecord) -> bool:
        if self.completion_id and not record.completion_id.startswith(self.completion_id):
            return False
        if self.agent and not self._for_agent(record):
            return False
        if self.lifecycle and record.lifecycle != self.lifecycle:
            return False
        if self.group and record.group != self.group:
            return False
        return not (self.errors_only and record.outcome == "ok")

    def _for_agent(self, record: MonitorRecord) -> bool:
        if record.agent is not None:
            if record.agent != self.agent:
                return False
            if record.kind == "request":  # its end: nothing of it follows
                self._of_agent.discard(record.completion_id)
            else:
                self._of_agent.add(record.completion_id)
            return True
        return record.completion_id in self._of_agent


async def follow_events(
    client: aredis.Redis, keys: Keys, *, from_start: bool = False, block_ms: int = 1000
) -> AsyncIterator[MonitorRecord]:
    """Every event record from now on (or from the start of the capped streams), forever;
    the records of one read (entries of several writers and event shards) come in time order."""
    streams = keys.event_streams
    positions: dict[str, Any] = (
        dict.fromkeys(streams, "0-0") if from_start else await latest_ids(client, streams)
    )
    while True:
        response = await xread_streams(client, positions, count=500, block_ms=block_ms)
        batch = []
        for stream, entries in response:
            positions[text(stream)] = entries[-1][0]
            batch += decoded_records(entries)
        for record in sorted(batch, key=lambda r: r.ts):
            yield record


async def recent_events(client: aredis.Redis, keys: Keys, count: int = 10_000) -> list[MonitorRecord]:
    """The newest `count` records (of every event shard), oldest first."""
    records = []
    for stream in keys.event_streams:
        records += await _newest(client, stream, count)
    return sorted(records, key=lambda r: r.ts)[-count:]


async def _newest(client: aredis.Redis, stream: str, count: int) -> list[MonitorRecord]:
    """At least the newest `count` records of one stream (all it has when fewer), read
    backwards a page of entries at a time."""
    pages: list[list[MonitorRecord]] = []
    found, before = 0, "+"
    while found < count:
        entries: Any = await client.xrevrange(stream, max=before, count=RECENT_PAGE)
        if not entries:
            break
        page = decoded_records(reversed(entries))
        pages.append(page)
        found += len(page)
        if len(entries) < RECENT_PAGE:
            break
        before = f"({text(entries[-1][0])}"
    return [record for page in reversed(pages) for record in page]


def decoded_records(entries: Any) -> list[MonitorRecord]:
    """The records of `events` entries as XRANGE returns them (undecodable ones skipped)."""
    records = []
    for _entry_id, fields in entries:
        try:
            records += monitor_records(fields)
        except DecodeError:
            continue
    return records


def format_event(record: MonitorRecord, *, with_link: bool = False) -> str:
    """One line; with `with_link`, a request's end line also names its waterfall in the
    console (a path: prefix it with the gateway's address)."""
    when = dt.datetime.fromtimestamp(record.ts).strftime("%H:%M:%S.%f")[:-3]
    where = record.group or "local"
    if record.version:
        where += f"@{record.version}"
    if record.kind == "request":
        where = "request"
    hooks = ",".join(record.hooks) or "-"
    line = (
        f"{when}  {record.completion_id[-12:]:>12}  {record.lifecycle:<19} {record.kind:<7} "
        f"{where:<12} {hooks:<40} {record.duration_ms:8.2f} ms  {record.outcome}"
    )
    if record.error:
        line += f"  ({record.error})"
    if with_link and record.kind == "request":
        line += f"  {request_link(record.completion_id)}"
    return line


class GroupStatus(BaseModel):
    name: str
    protocol: str = Field(description="The worker protocol version the group announced.")
    refused: str | None = Field(
        default=None, description="Why orchestrators of this build refuse the group (its protocol), or null."
    )
    replicas: list[str]
    replica_protocols: dict[str, str] = Field(
        default_factory=dict, description="The protocol each live replica's heartbeat names."
    )
    hooks: list[str]
    tools: list[str]
    lag: int
    pending: int
    agents: list[str] = Field(default_factory=list, description="The agents it serves; empty: every agent.")
    versions: list[VersionStatus] = []
    """The versions its replicas run (none for replicas from before versions)."""
    observe_lag: int = 0
    """Observation entries (one per request) not yet delivered to the group's observers."""
    observe_pending: int = 0
    """Observation entries delivered to a replica and not yet acked."""
    observe_dropped: int = 0
    """Observation entries its backlog bound dropped, oldest first, since the count began
    (hookbus.bus.groups.observer_backlog)."""
    observe_dropped_bytes: int = 0
    """The bytes of Redis memory those entries held."""
    heartbeats: dict[str, float] = Field(default_factory=dict, description="Replica -> its last heartbeat (unix time).")
    in_flight: dict[str, int] = Field(
        default_factory=dict, description="Replica -> entries delivered to it and not yet acked."
    )
    hops_last_minute: dict[str, int] = Field(
        default_factory=dict, description="Live replica -> the hops it finished in the last minute."
    )


class AgentStatus(BaseModel):
    """One agent: who serves it and its own request queue (`requests:<name>`)."""

    name: str
    orchestrators: list[str] = Field(description="Live orchestrators serving it (none: known, served by nobody now).")
    models: list[str] = Field(default_factory=list, description="Models a client may name as `<agent>/<model>`.")
    lag: int
    pending: int
    requests_last_minute: int = 0
    errors_last_minute: int = 0

    @property
    def requests_per_second(self) -> float:
        return self.requests_last_minute / 60


class BusState(BaseModel):
    """What the registry, heartbeats and consumer groups say now (no events read)."""

    groups: list[GroupStatus]
    orchestrators: dict[str, float] = Field(description="Live orchestrator -> its last heartbeat.")
    requests_lag: int
    requests_pending: int
    dead_letters: int
    agents: list[AgentStatus] = Field(default_factory=list, description="Every agent known, by name.")


class Status(BaseModel):
    groups: list[GroupStatus]
    orchestrators: list[str]
    requests_lag: int
    requests_pending: int
    requests_last_minute: int
    errors_last_minute: int
    dead_letters: int
    agents: list[AgentStatus] = Field(default_factory=list)

    def of_agent(self, name: str) -> Status:
        """Only what concerns one agent: its own line, the groups that serve it and the
        orchestrators serving it."""
        agents = [a for a in self.agents if a.name == name]
        serving = {o for a in agents for o in a.orchestrators}
        return self.model_copy(update={
            "agents": agents,
            "groups": [g for g in self.groups if not g.agents or name in g.agents],
            "orchestrators": [o for o in self.orchestrators if o in serving],
        })


async def read_bus_state(client: aredis.Redis, keys: Keys, hops: Sequence[MonitorRecord] = ()) -> BusState:
    """Groups with their live replicas (heartbeat, in flight, version), lag and pending;
    live orchestrators; the request queue's backlog; the dead-letter count. `hops`: the
    last minute's hop records, which each version's hop count is taken from (none: 0)."""
    now = time.time()
    registry = await client.hgetall(keys.registry)
    hops_by_replica = Counter((h.group, h.replica) for h in hops)  # counted once, not per group and replica
    drops = await read_drops(client, keys)
    groups = []
    for raw_name, body in sorted(registry.items()):
        name = text(raw_name)
        try:
            announcement = GroupAnnouncement.model_validate_json(body)
        except ValueError:
            continue
        beats = await _heartbeats(client, keys.replicas(name), now)
        replicas = sorted(beats)
        versions = await read_versions(client, keys, name, replicas, hops)
        streams = keys.hook_streams(name) + [s for v in versions for s in keys.pinned_hook_streams(name, v.version)]
        lag, pending = await group_backlog(client, streams, name)
        observe_lag, observe_pending = (0, 0)
        if any(h.observe for h in announcement.hooks):
            observe_lag, observe_pending = await group_backlog(client, keys.observe_streams(name), name)
        groups.append(
            GroupStatus(
                name=name,
                protocol=announcement.protocol,
                refused=refusal(announcement.protocol),
                replicas=replicas,
                replica_protocols=await replica_protocols(client, keys, name, replicas),
                versions=versions,
                hooks=[
                    f"{h.skill}.{h.method}@{h.lifecycle}:{h.priority}{' (observer)' if h.observe else ''}"
                    for h in announcement.hooks
                ],
                tools=[t.name for t in announcement.tools],
                agents=announcement.agents,
                lag=lag,
                pending=pending,
                observe_lag=observe_lag,
                observe_pending=observe_pending,
                observe_dropped=drops.get(name, ObserverDrops()).entries,
                observe_dropped_bytes=drops.get(name, ObserverDrops()).bytes,
                heartbeats=beats,
                in_flight=await _in_flight(client, streams, name),
                hops_last_minute={r: hops_by_replica[(name, r)] for r in replicas},
            )
        )
    requests_lag, requests_pending = await group_backlog(client, keys.request_streams, ORCHESTRATOR_GROUP)
    return BusState(
        groups=groups,
        orchestrators=await _heartbeats(client, keys.orchestrators, now),
        requests_lag=requests_lag,
        requests_pending=requests_pending,
        dead_letters=await client.xlen(keys.dead_letter),
        agents=await read_agents(client, keys),
    )


async def read_agents(client: aredis.Redis, keys: Keys) -> list[AgentStatus]:
    """Every agent known (hookbus.bus.groups.served_agents), with its queue's backlog."""
    served = await AgentsView(client, keys).refresh()
    agents = []
    for name, agent in sorted(served.agents.items()):
        lag, pending = await group_backlog(client, keys.agent_request_streams(name), ORCHESTRATOR_GROUP)
        agents.append(
            AgentStatus(
                name=name, orchestrators=list(agent.orchestrators), models=agent.card.models, lag=lag, pending=pending
            )
        )
    return agents


async def read_status(client: aredis.Redis, keys: Keys) -> Status:
    minute_start = f"{int((time.time() - 60) * 1000)}-0"
    records: list[MonitorRecord] = []
    for stream in keys.event_streams:
        minute: Any = await client.xrange(stream, min=minute_start, max="+")
        records += decoded_records(minute)
    state = await read_bus_state(client, keys, [r for r in records if r.kind == "hop"])
    finished = [r for r in records if r.kind == "request"]
    agents = [
        agent.model_copy(update={
            "requests_last_minute": sum(1 for r in finished if r.agent == agent.name),
            "errors_last_minute": sum(1 for r in finished if r.agent == agent.name and r.outcome != "ok"),
        })
        for agent in state.agents
    ]
    return Status(
        groups=state.groups,
        orchestrators=sorted(state.orchestrators),
        requests_lag=state.requests_lag,
        requests_pending=state.requests_pending,
        requests_last_minute=len(finished),
        errors_last_minute=sum(1 for r in finished if r.outcome != "ok"),
        dead_letters=state.dead_letters,
        agents=agents,
    )


async def _heartbeats(client: aredis.Redis, heartbeat_set: str, now: float) -> dict[str, float]:
    """Members of a heartbeat sorted set seen within REPLICA_TTL, with their last beat."""
    members: Any = await client.zrangebyscore(heartbeat_set, now - REPLICA_TTL, "+inf", withscores=True)
    return {text(member): float(beat) for member, beat in members}


async def _in_flight(client: aredis.Redis, streams: Sequence[str], group: str) -> dict[str, int]:
    """Consumer -> its pending entries, summed over the shards of a group's stream."""
    held: dict[str, int] = {}
    for stream in streams:
        try:
            consumers = await client.xinfo_consumers(stream, group)
        except aredis.ResponseError:  # no stream or no group yet
            continue
        for consumer in consumers:
            name = text(consumer.get("name"))
            held[name] = held.get(name, 0) + int(consumer.get("pending", 0))
    return held


async def group_backlog(client: aredis.Redis, streams: Sequence[str], group: str) -> tuple[int, int]:
    """(entries not yet delivered to the group, entries delivered but not acked), summed
    over the shards of a sharded stream."""
    backlogs = [await _shard_backlog(client, stream, group) for stream in streams]
    return sum(lag for lag, _ in backlogs), sum(pending for _, pending in backlogs)


async def _shard_backlog(client: aredis.Redis, stream: str, group: str) -> tuple[int, int]:
    try:
        infos = await client.xinfo_groups(stream)
    except aredis.ResponseError:
        return 0, 0
    info = next((i for i in infos if text(i.get("name")) == group), None)
    if info is None:
        return await client.xlen(stream), 0
    pending = int(info.get("pending", 0))
    lag = info.get("lag")
    if lag is None:  # Redis < 7 has no lag field: count what lies after last-delivered-id
        last = text(info.get("last-delivered-id") or "0-0")
        undelivered: Any = await client.xrange(stream, min=f"({last}", max="+", count=LAG_SCAN_LIMIT)
        lag = len(undelivered)
    return int(lag), pending


def format_status(status: Status) -> str:
    lines = [
        f"orchestrators ({len(status.orchestrators)} live): {', '.join(status.orchestrators) or '-'}",
        f"requests: lag {status.requests_lag}, pending {status.requests_pending}, "
        f"finished in the last minute {status.requests_last_minute} ({status.errors_last_minute} errors)",
        f"dead letters: {status.dead_letters}",
        "",
    ]
    if status.agents:
        lines.append(f"{'agent':<16} {'orchestrators':>13} {'lag':>6} {'pending':>8} {'req/s':>7} {'errors/min':>10}")
        lines += [
            f"{a.name:<16} {len(a.orchestrators):>13} {a.lag:>6} {a.pending:>8} "
            f"{a.requests_per_second:>7.2f} {a.errors_last_minute:>10}"
            + ("" if a.orchestrators else "  (served by nobody now)")
            for a in status.agents
        ]
        lines.append("")
    lines.append(f"{'group':<16} {'replicas':>8} {'lag':>6} {'pending':>8}  hooks / tools")
    for group in status.groups:
        lines.append(
            f"{group.name:<16} {len(group.replicas):>8} {group.lag:>6} {group.pending:>8}  "
            f"{', '.join(group.hooks + [f'tool:{t}' for t in group.tools])}"
        )
        if group.agents:
            lines.append(f"{'':<16}   agents: {', '.join(group.agents)}")
        if group.refused:
            lines.append(f"{'':<16}   REFUSED: {group.refused} (its hooks are not called)")
        if group.observe_lag or group.observe_pending or group.observe_dropped:
            lines.append(
                f"{'':<16}   observer backlog: lag {group.observe_lag}, pending {group.observe_pending}"
                + (f", DROPPED {group.observe_dropped} ({group.observe_dropped_bytes:,} bytes: over its bound)"
                   if group.observe_dropped else "")
            )
        versioned = {r for v in group.versions for r in v.replicas}
        lines += format_versions(group.versions, partial(replica_work, group))
        lines += [
            f"{'':<16}   - {replica} {replica_work(group, replica)}"
            for replica in group.replicas if replica not in versioned
        ]
    if not status.groups:
        lines.append("(no worker groups registered)")
    return "\n".join(lines)


def replica_work(group: GroupStatus, replica: str) -> str:
    """What one replica's status line says after its name: the protocol it speaks and the
    work it takes (a replica just started shows its first hops within the minute)."""
    return (
        f"(protocol {group.replica_protocols.get(replica, '?')}): "
        f"{group.hops_last_minute.get(replica, 0)} hops in the last minute, {group.in_flight.get(replica, 0)} in flight"
    )


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout: float, interval: float = 0.1) -> bool:
    """Poll an async predicate until it is true or the timeout passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(interval)
    return False
