"""The versions part of `hookbus status`: per worker group, which version each live replica
runs, which replicas drain, how many requests each version is serving, how its hops
went in the last minute (a canary's error rate beside the stable version's) and the
canary share, read from the keys of hookbus.bus.groups.versions."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import redis.asyncio as aredis
from pydantic import BaseModel

from hookbus.bus.groups.versions import parse_infos, parse_rollout, serving_counts, version_states
from hookbus.bus.keys import Keys
from hookbus.bus.wire.envelopes import MonitorRecord


class VersionStatus(BaseModel):
    version: str
    replicas: list[str]
    draining: list[str]
    serving: int
    """Requests pinned to this version that have not ended."""
    hops_last_minute: int
    hop_errors_last_minute: int
    canary_share: float | None = None
    """Set while this version is a group's canary (`hookbus rollout`)."""
    started: dict[str, float] = {}
    """Replica -> when it started (unix time), as its ReplicaInfo says."""


async def read_versions(
    client: aredis.Redis, keys: Keys, group: str, live: Sequence[str], hops: Sequence[MonitorRecord]
) -> list[VersionStatus]:
    """The versions of `group`'s live replicas, oldest first; `hops`: the hop records of
    the last minute (of every group)."""
    infos = parse_infos(await client.hgetall(keys.replica_versions(group)), live)
    states = version_states(infos)
    rollout = parse_rollout(await client.hgetall(keys.rollout(group)))
    serving = await serving_counts(client, keys, group, states)
    mine = [h for h in hops if h.group == group]
    return [
        VersionStatus(
            version=version,
            replicas=list(state.replicas),
            draining=list(state.draining),
            serving=serving[version],
            hops_last_minute=sum(1 for h in mine if h.version == version),
            hop_errors_last_minute=sum(1 for h in mine if h.version == version and h.outcome != "ok"),
            canary_share=rollout.share if rollout is not None and rollout.canary == version else None,
            started={replica: infos[replica].started for replica in state.replicas},
        )
        for version, state in states.items()
    ]


def format_versions(versions: Sequence[VersionStatus], describe: Callable[[str], str]) -> list[str]:
    """One line per version (and its replicas below it, each with what `describe` says of
    it: its protocol and its work), for the status table."""
    lines = []
    for v in versions:
        canary = f", canary {v.canary_share:.0%}" if v.canary_share is not None else ""
        lines.append(
            f"{'':<16}   version {v.version}: {len(v.replicas)} replicas, serving {v.serving} requests, "
            f"{v.hops_last_minute} hops in the last minute ({v.hop_errors_last_minute} failed){canary}"
        )
        lines += [
            f"{'':<16}     - {r} {describe(r)}{' (draining)' if r in v.draining else ''}"
            for r in v.replicas
        ]
    return lines
