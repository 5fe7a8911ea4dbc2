"""Which worker groups exist, what hooks and tools they serve, and which replicas are alive.

Workers announce their group's descriptors (a hash field per group) and heartbeat per
replica (a sorted set per group). Orchestrators keep a cached view and refresh it from
one small pipeline every half second, rebuilding the hook order only when the registry
version moved, so no request pays a Redis round trip for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time

import redis.asyncio as aredis
import structlog
from pydantic import Field

from hookbus.bus.connection.retrying import RECONNECT_ERRORS
from hookbus.bus.connection.values import text
from hookbus.bus.groups.periodic import cancel_and_wait
from hookbus.bus.keys import Keys
from hookbus.bus.wire.envelopes import Envelope
from hookbus.skills.descriptors import HookDescriptor, ToolDescriptor

log = structlog.get_logger("hookbus.registry")

HEARTBEAT_EVERY = 2.0
REPLICA_TTL = 10.0
REFRESH_EVERY = 0.5


class GroupAnnouncement(Envelope):
    group: str
    hooks: list[HookDescriptor] = Field(default_factory=list)
    tools: list[ToolDescriptor] = Field(default_factory=list)
    compaction: list[str] = Field(
        default_factory=list,
        description="Skills of the group that define on_compaction(outcome, ctx).",
    )
    first_seen: float = Field(default_factory=time.time)

    def fingerprint(self) -> str:
        body = self.model_dump_json(include={"group", "hooks", "tools", "compaction"})
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


async def heartbeat(client: aredis.Redis, keys: Keys, group: str, replica: str) -> None:
    await client.zadd(keys.replicas(group), {replica: time.time()})


async def leave(client: aredis.Redis, keys: Keys, group: str, replica: str) -> None:
    await client.zrem(keys.replicas(group), replica)


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
        self.groups: dict[str, GroupAnnouncement] = {}
        self.live: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._poll(), name="hookbus-registry")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    def is_live(self, group: str) -> bool:
        return self.live.get(group, 0) > 0

    async def refresh(self) -> None:
        groups = list(self.groups)
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.get(self._keys.registry_version)
            for group in groups:
                pipe.zcount(self._keys.replicas(group), time.time() - REPLICA_TTL, "+inf")
            version_raw, *counts = await pipe.execute()
        self.live = dict(zip(groups, (int(c) for c in counts), strict=True))
        registry_version = int(version_raw or 0)
        if registry_version != self._registry_version:
            await self._reload(registry_version)

    async def _reload(self, registry_version: int) -> None:
        raw = await self._client.hgetall(self._keys.registry)
        groups: dict[str, GroupAnnouncement] = {}
        for name, body in raw.items():
            try:
                groups[text(name)] = GroupAnnouncement.model_validate_json(body)
            except ValueError as exc:
                log.warning("bad_announcement_ignored", group=name, error=str(exc))
        self.groups = dict(sorted(groups.items(), key=lambda item: (item[1].first_seen, item[0])))
        self._registry_version = registry_version
        self.version += 1
        async with self._client.pipeline(transaction=False) as pipe:
            for group in self.groups:
                pipe.zcount(self._keys.replicas(group), time.time() - REPLICA_TTL, "+inf")
            counts = await pipe.execute()
        self.live = dict(zip(self.groups, (int(c) for c in counts), strict=True))
        log.info("registry_loaded", groups=list(self.groups), version=registry_version)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_EVERY)
            try:
                await self.refresh()
            except RECONNECT_ERRORS as exc:
                log.warning("registry_refresh_failed", error=str(exc))
