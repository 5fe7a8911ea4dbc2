"""Which version each replica of a worker group runs, and which version a request is pinned to.

A replica runs its group at a version (`hookbus worker --version`, or one derived from
its skills: hookbus.services.worker.versioning). It writes a `ReplicaInfo` under its name in
`replica-versions:{group}` next to its heartbeat, reads the group's shared stream
`hooks:{group}` and the stream of its version, `hooks:{group}@{version}`, which only
replicas of that version read: a consumer group cannot filter entries, so a stream per
version is what keeps a hop pinned to a version on that version.

An orchestrator pins a request to a version of each group when the request starts
(`choose_version`), sends every hop of that request to the pinned version's stream while
a replica of it lives, and counts the request in `serving:{group}@{version}` (completion
id -> when it was last stamped) until it ends, publishing the count every
`PUBLISH_EVERY` seconds (hookbus.services.orchestrator.serving.version_pins): that count is what
`hookbus status` shows per version, and what the last replica of a version waits for
before it leaves (hookbus.services.worker.drain).

All of these keys sit in the registry's slot (hookbus.bus.keys).
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import redis.asyncio as aredis
from pydantic import BaseModel, Field

from hookbus.bus.connection.values import text
from hookbus.bus.keys import Keys

PUBLISH_EVERY = 0.5
"""Seconds between an orchestrator's publications of its `serving:` counts: how late a
new pin or an ended request shows there."""
RESTAMP_EVERY = 5.0
"""Seconds between the stamps an orchestrator puts again on every request it still runs."""
PIN_STALE = 3 * RESTAMP_EVERY
"""Seconds after which a pin not stamped again (its orchestrator died before the request
ended) is no longer counted."""

VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$"
"""What a version string may be, as the protocol spec states it (ECMA-262 semantics, as in
JSON Schema: `$` is the end of the text, so no trailing newline or space gets through)."""
VERSION_RULE = "1-64 letters, digits, '.', '_', '+' or '-' (starting with a letter or digit)"
_VERSION = re.compile(VERSION_PATTERN.removeprefix("^").removesuffix("$"))


def check_version(version: str) -> str:
    """`version` if it can name a stream (`hooks:{group}@{version}`), else ValueError. The
    whole text must match (Python's `$` would let a trailing newline through)."""
    if not _VERSION.fullmatch(version):
        raise ValueError(f"version {version!r}: use {VERSION_RULE}")
    return version


class ReplicaInfo(BaseModel):
    """What one replica says about itself in `replica-versions:{group}`."""

    version: str
    hooks: str = Field(description="Fingerprint of the hooks' set and priorities (and the tools) it serves.")
    draining: bool = Field(default=False, description="Told to stop: no new request is pinned to it.")
    started: float = Field(default_factory=time.time, description="When the replica started (unix time).")


async def publish(client: aredis.Redis, keys: Keys, group: str, replica: str, info: ReplicaInfo) -> None:
    await client.hset(keys.replica_versions(group), replica, info.model_dump_json())


def parse_infos(raw: Mapping[bytes | str, bytes | str], live: Iterable[str]) -> dict[str, ReplicaInfo]:
    """The infos of the live replicas among `raw` (a HGETALL of `replica-versions:`);
    a replica without a readable info runs no version (an older worker)."""
    infos = {}
    by_name = {text(k): v for k, v in raw.items()}
    for replica in live:
        body = by_name.get(replica)
        if body is None:
            continue
        try:
            infos[replica] = ReplicaInfo.model_validate_json(body)
        except ValueError:
            continue
    return infos


@dataclass(frozen=True)
class VersionState:
    """One version of a group as the live replicas show it."""

    version: str
    replicas: tuple[str, ...]
    draining: tuple[str, ...]
    first_started: float
    hooks: frozenset[str]

    @property
    def takes_new_requests(self) -> bool:
        return len(self.draining) < len(self.replicas)


def version_states(infos: Mapping[str, ReplicaInfo]) -> dict[str, VersionState]:
    """Per version: its live replicas (draining ones included), oldest version first."""
    grouped: dict[str, list[tuple[str, ReplicaInfo]]] = {}
    for replica, info in infos.items():
        grouped.setdefault(info.version, []).append((replica, info))
    states = [
        VersionState(
            version=version,
            replicas=tuple(sorted(r for r, _ in members)),
            draining=tuple(sorted(r for r, i in members if i.draining)),
            first_started=min(i.started for _, i in members),
            hooks=frozenset(i.hooks for _, i in members),
        )
        for version, members in grouped.items()
    ]
    return {s.version: s for s in sorted(states, key=lambda s: (s.first_started, s.version))}


async def live_versions(client: aredis.Redis, keys: Keys, group: str, *, alive_within: float) -> dict[str, VersionState]:
    """The versions of `group`'s replicas with a heartbeat in the last `alive_within` seconds."""
    live = await client.zrangebyscore(keys.replicas(group), time.time() - alive_within, "+inf")
    infos = await client.hgetall(keys.replica_versions(group))
    return version_states(parse_infos(infos, [text(m) for m in live]))


class Rollout(BaseModel):
    """A canary: `share` of the new requests go to `canary`, the rest to the newest other version."""

    canary: str
    share: float = Field(ge=0.0, le=1.0)


async def set_rollout(client: aredis.Redis, keys: Keys, group: str, rollout: Rollout | None) -> None:
    """Start (or change) a canary of `group`; None ends it (promote or roll back)."""
    if rollout is None:
        await client.delete(keys.rollout(group))
    else:
        await client.hset(keys.rollout(group), mapping={"canary": rollout.canary, "share": repr(rollout.share)})


def parse_rollout(raw: Mapping[bytes | str, bytes | str]) -> Rollout | None:
    fields = {text(k): text(v) for k, v in raw.items()}
    if "canary" not in fields:
        return None
    try:
        return Rollout(canary=fields["canary"], share=float(fields.get("share", "0")))
    except ValueError:
        return None


def choose_version(
    states: Mapping[str, VersionState], rollout: Rollout | None, draw: float | None = None
) -> str | None:
    """The version a new request is pinned to: the newest version with a replica that
    is not draining (the canary's share of requests to the canary, the rest to the newest
    other one); the newest live one if all drain; None for a group without versions."""
    if not states:
        return None
    open_versions = [s.version for s in states.values() if s.takes_new_requests] or list(states)
    newest = open_versions[-1]
    if rollout is None or rollout.canary not in open_versions:
        return newest
    stable = [v for v in open_versions if v != rollout.canary]
    if not stable:
        return rollout.canary
    if (random.random() if draw is None else draw) < rollout.share:
        return rollout.canary
    return stable[-1]


async def serving_counts(client: aredis.Redis, keys: Keys, group: str, versions: Iterable[str]) -> dict[str, int]:
    """How many requests each version of `group` is serving (pinned, not yet ended)."""
    names = list(versions)
    since = time.time() - PIN_STALE
    async with client.pipeline(transaction=False) as pipe:
        for version in names:
            pipe.zcount(keys.serving(group, version), since, "+inf")
        counts = await pipe.execute()
    return dict(zip(names, (int(c) for c in counts), strict=True))
