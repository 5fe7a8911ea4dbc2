"""Which worker groups exist, what hooks and tools they serve, and which replicas are alive.

Workers announce their group's descriptors (a hash field per group) and heartbeat per
replica (a sorted set per group: the liveness everybody judges by; beside it, a record of
the replica that expires on its own, saying which protocol it speaks). Orchestrators keep
a cached view and refresh it from one small pipeline every half second, rebuilding the
hook order only when the registry version moved, so no request pays a Redis round trip
for it; the time the view waited on Redis (a restart) is not held against a replica's
heartbeat (hookbus.bus.groups.outage_grace). A group that speaks a protocol major this
build does not serve is refused: listed in `refused` with the reason, kept out of
`groups` (hookbus.bus.wire.protocol_version); no hop goes to it (`unavailable`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable
from typing import Any, Literal

import redis.asyncio as aredis
import structlog
from pydantic import Field

from hookbus.bus.connection.retrying import RECONNECT_ERRORS
from hookbus.bus.connection.values import text
from hookbus.bus.groups.outage_grace import OutageGrace
from hookbus.bus.groups.periodic import cancel_and_wait
from hookbus.bus.groups.versions import (
    Rollout,
    VersionState,
    parse_infos,
    parse_rollout,
    version_states,
)
from hookbus.bus.keys import Keys
from hookbus.bus.wire.envelopes import Envelope
from hookbus.bus.wire.protocol_version import PROTOCOL, UNSTATED, VERSION_PATTERN, at_least, refusal
from hookbus.bus.wire.stream_text import TEXT_KEPT_PROTOCOL
from hookbus.skills.descriptors import HookDescriptor, ToolDescriptor

log = structlog.get_logger("hookbus.registry")

HEARTBEAT_EVERY = 2.0
REPLICA_TTL = 10.0
REFRESH_EVERY = 0.5


def _protocol_field() -> Any:
    return Field(
        default=UNSTATED,
        description='The worker protocol version ("MAJOR.MINOR") the worker speaks; missing means "1.0".',
        json_schema_extra={"pattern": VERSION_PATTERN},
    )


class GroupAnnouncement(Envelope):
    """A worker group's hash field in the registry: what it serves and which protocol it speaks.
    Every replica writes it at start; it changes (and the registry version moves) only when
    the descriptors or the protocol changed."""

    group: str
    protocol: str = _protocol_field()
    hooks: list[HookDescriptor] = Field(default_factory=list)
    tools: list[ToolDescriptor] = Field(default_factory=list)
    agents: list[str] = Field(
        default_factory=list,
        description="The agents (by name) whose requests the group serves; empty: every agent.",
    )
    first_seen: float = Field(default_factory=time.time)

    def serves(self, agent: str) -> bool:
        return not self.agents or agent in self.agents

    def fingerprint(self) -> str:
        # a group of every agent fingerprints as it did before groups named agents
        body = self.model_dump_json(include={"group", "protocol", "hooks", "tools"} | ({"agents"} if self.agents else set()))
        return hashlib.sha256(body.encode()).hexdigest()[:16]


async def announce(client: aredis.Redis, keys: Keys, announcement: GroupAnnouncement) -> None:
    """Publish a group's descriptors; bumps the registry version only if they changed."""
    existing_raw = await client.hget(keys.registry, announcement.group)
    if existing_raw:
        with contextlib.suppress(ValueError):
            existing = GroupAnnouncement.model_validate_json(existing_raw)
            if existing.fingerprint() == announcement.fingerprint():
                return
            log.warning(
                "group_announcement_changed",
                group=announcement.group,
                hint="every replica of a group must host the same skills; the last announcement wins",
            )
            announcement = announcement.model_copy(update={"first_seen": existing.first_seen})
    async with client.pipeline(transaction=True) as pipe:
        pipe.hset(keys.registry, announcement.group, announcement.model_dump_json())
        pipe.incr(keys.registry_version)
        await pipe.execute()
    log.info("group_announced", group=announcement.group, hooks=len(announcement.hooks), tools=len(announcement.tools))


class ReplicaHeartbeat(Envelope):
    """A replica's heartbeat record: the string key `{prefix}replica:{group}:{replica}`
    (`Keys.replica_heartbeat`), written with every beat beside the replica's score (the
    beat's unix time) in the sorted set `{prefix}replicas:{group}`, and expiring 10 seconds
    (REPLICA_TTL) later."""

    kind: Literal["heartbeat"] = "heartbeat"
    group: str
    replica: str
    protocol: str = _protocol_field()
    ts: float = Field(default_factory=time.time, description="Unix time of the beat (the sorted set's score).")


async def heartbeat(client: aredis.Redis, keys: Keys, group: str, replica: str) -> None:
    """One beat, in one round trip: the score that says the replica lives, and its record."""
    beat = ReplicaHeartbeat(group=group, replica=replica, protocol=PROTOCOL)
    async with client.pipeline(transaction=False) as pipe:
        pipe.zadd(keys.replicas(group), {replica: beat.ts})
        pipe.set(keys.replica_heartbeat(group, replica), beat.model_dump_json(), ex=int(REPLICA_TTL))
        await pipe.execute()


async def leave(client: aredis.Redis, keys: Keys, group: str, replica: str) -> None:
    """Gone from the group at once, in one round trip: no heartbeat, no record, no version
    (hookbus.bus.groups.versions)."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.zrem(keys.replicas(group), replica)
        pipe.delete(keys.replica_heartbeat(group, replica))
        pipe.hdel(keys.replica_versions(group), replica)
        await pipe.execute()


async def replica_protocols(client: aredis.Redis, keys: Keys, group: str, replicas: list[str]) -> dict[str, str]:
    """The protocol each replica's latest heartbeat record names; "1.0" when it has none
    (a worker from before the record existed)."""
    if not replicas:
        return {}
    bodies = await client.mget([keys.replica_heartbeat(group, r) for r in replicas])
    protocols = {}
    for replica, body in zip(replicas, bodies, strict=True):
        try:
            protocols[replica] = ReplicaHeartbeat.model_validate_json(body).protocol if body else UNSTATED
        except ValueError:
            protocols[replica] = "unreadable"
    return protocols


async def live_replicas(client: aredis.Redis, keys: Keys, group: str) -> list[str]:
    members = await client.zrangebyscore(keys.replicas(group), time.time() - REPLICA_TTL, "+inf")
    return [text(m) for m in members]


class RegistryView:
    """An orchestrator's cached picture of the registry."""

    def __init__(self, client: aredis.Redis, keys: Keys) -> None:
        self._client = client
        self._keys = keys
        self._registry_version: int | None = None
        self.version = 0
        self.announced: dict[str, GroupAnnouncement] = {}
        """Every group with a readable announcement, in registry order (first seen first)."""
        self.groups: dict[str, GroupAnnouncement] = {}
        """The announced groups this orchestrator serves, in registry order."""
        self.refused: dict[str, str] = {}
        """Announced groups it cannot serve (their protocol), and why."""
        self.live: dict[str, int] = {}
        self.versions: dict[str, dict[str, VersionState]] = {}
        """Per group, the versions its live replicas run (oldest first; empty: unversioned)."""
        self.rollouts: dict[str, Rollout] = {}
        self._replicas: dict[str, list[str]] = {}
        """Per group, its live replicas' names."""
        self._protocols: dict[tuple[str, str], str] = {}
        """The protocol of each live replica whose heartbeat record was read (it never changes)."""
        self._conflicts: set[tuple[str, str]] = set()
        self._grace = OutageGrace(ttl=REPLICA_TTL, shortest=HEARTBEAT_EVERY)
        self._task: asyncio.Task[None] | None = None
        self.on_refresh: list[Callable[[], None]] = []
        """Called after each look at the replicas (every `REFRESH_EVERY` seconds): what
        must act as soon as a replica is seen gone."""

    @property
    def client(self) -> aredis.Redis:
        return self._client

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._poll(), name="hookbus-registry")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    def is_live(self, group: str) -> bool:
        return self.live.get(group, 0) > 0

    def replicas(self, group: str) -> list[str]:
        """The group's live replicas' names, as of the last refresh."""
        return self._replicas.get(group, [])

    def keeps_text(self, group: str) -> bool:
        """Whether the group's announcement and every live replica's heartbeat say protocol
        1.1 or later: its workers keep a stream's text (hookbus.bus.wire.stream_text), so a
        batched on_chunk hop need not carry it. A replica whose record is not read yet
        counts as older (the hop then carries the text, which every version reads)."""
        announcement = self.groups.get(group)
        if announcement is None or not at_least(announcement.protocol, TEXT_KEPT_PROTOCOL):
            return False
        return all(
            at_least(self._protocols.get((group, replica), UNSTATED), TEXT_KEPT_PROTOCOL)
            for replica in self._replicas.get(group, ())
        )

    def unavailable(self, group: str) -> str | None:
        """Why no hop can go to `group` now (refused, or no live replica), or None."""
        if group in self.refused:
            return f"worker group {group!r} is refused: {self.refused[group]}"
        if not self.is_live(group):
            return f"no live replica in worker group {group!r}"
        return None

    async def refresh(self) -> None:
        groups = list(self.groups)
        self._grace.reading()
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.get(self._keys.registry_version)
            self._queue_replicas(pipe, groups)
            version_raw, *replies = await pipe.execute()
        self._take_replicas(groups, replies, oldest_live=self._grace.answered())
        await self._read_protocols()
        registry_version = int(version_raw or 0)
        if registry_version != self._registry_version:
            await self._reload(registry_version)

    def _queue_replicas(self, pipe: aredis.client.Pipeline, groups: list[str]) -> None:
        """Per group: its replicas' last beats, their versions, its rollout (three replies).
        Every beat is read (a group's set holds its recent replicas only: the janitor
        forgets the long gone), since which are live is known only once Redis answered."""
        for group in groups:
            pipe.zrange(self._keys.replicas(group), 0, -1, withscores=True)
            pipe.hgetall(self._keys.replica_versions(group))
            pipe.hgetall(self._keys.rollout(group))

    async def _read_protocols(self) -> None:
        """The heartbeat records of live replicas not read before, one MGET per group that
        has any (a replica's protocol is read once in its life)."""
        for group, replicas in self._replicas.items():
            unread = [r for r in replicas if (group, r) not in self._protocols]
            if unread:
                for replica, protocol in (await replica_protocols(self._client, self._keys, group, unread)).items():
                    self._protocols[(group, replica)] = protocol
        alive = {(g, r) for g, replicas in self._replicas.items() for r in replicas}
        for gone in [key for key in self._protocols if key not in alive]:
            del self._protocols[gone]

    def _take_replicas(self, groups: list[str], replies: list[object], *, oldest_live: float) -> None:
        replica_names: dict[str, list[str]] = {}
        live: dict[str, int] = {}
        versions: dict[str, dict[str, VersionState]] = {}
        rollouts: dict[str, Rollout] = {}
        for index, group in enumerate(groups):
            beats, infos_raw, rollout_raw = replies[3 * index : 3 * index + 3]
            names = [text(member) for member, beat in beats if beat >= oldest_live]  # type: ignore[attr-defined]
            replica_names[group] = names
            live[group] = len(names)
            versions[group] = version_states(parse_infos(infos_raw, names))  # type: ignore[arg-type]
            rollout = parse_rollout(rollout_raw)  # type: ignore[arg-type]
            if rollout is not None:
                rollouts[group] = rollout
            self._report_conflicts(group, versions[group])
        self.live, self.versions, self.rollouts, self._replicas = live, versions, rollouts, replica_names
        for listener in self.on_refresh:
            listener()

    def _report_conflicts(self, group: str, states: dict[str, VersionState]) -> None:
        """Two replicas announcing one version with different hooks: a deployment error
        (the version no longer says what runs), logged once per group and version."""
        for state in states.values():
            if len(state.hooks) > 1 and (group, state.version) not in self._conflicts:
                self._conflicts.add((group, state.version))
                log.error(
                    "version_hooks_differ", group=group, version=state.version, replicas=list(state.replicas),
                    hint="replicas announcing one version must serve the same hooks and priorities",
                )

    async def _reload(self, registry_version: int) -> None:
        raw = await self._client.hgetall(self._keys.registry)
        groups: dict[str, GroupAnnouncement] = {}
        refused: dict[str, str] = {}
        for name, body in raw.items():
            try:
                announcement = GroupAnnouncement.model_validate_json(body)
            except ValueError as exc:
                log.warning("bad_announcement_ignored", group=name, error=str(exc))
                continue
            groups[text(name)] = announcement
            reason = refusal(announcement.protocol)
            if reason is None:
                continue
            refused[text(name)] = reason
            if text(name) not in self.refused:  # one line when a group starts being refused
                log.error(
                    "group_refused", group=text(name), protocol=announcement.protocol, reason=reason,
                    effect="its hooks are not called (a critical one fails its requests: 503 no_worker); its tools are unavailable",
                )
        self.refused = refused
        self.announced = dict(sorted(groups.items(), key=lambda item: (item[1].first_seen, item[0])))
        self.groups = {name: a for name, a in self.announced.items() if name not in refused}
        self._registry_version = registry_version
        self.version += 1
        names = list(self.groups)
        async with self._client.pipeline(transaction=False) as pipe:
            self._queue_replicas(pipe, names)
            replies = await pipe.execute()
        self._take_replicas(names, replies, oldest_live=self._grace.oldest_live())
        await self._read_protocols()
        log.info("registry_loaded", groups=list(self.groups), version=registry_version)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_EVERY)
            try:
                await self.refresh()
            except RECONNECT_ERRORS as exc:
                log.warning("registry_refresh_failed", error=str(exc))
