"""What every worker must agree on besides the messages: timings, size limits, the version
rule, key names and the Lua scripts they run, as the spec's `protocol.json` states them
under `constants`.

They are read here from the Python modules that use them, so the spec says what the Python
worker does; the TypeScript package reads them from the committed spec when it is built
(skills/typescript/scripts/protocol.mjs writes src/generated/protocol.ts), and the
conformance kit (hookbus.services.protocol.conformance.checks) checks a worker against
the drain timing, the size limits and the version rule.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from hookbus.bus.connection.shards import DEFAULT_CLUSTER_SHARDS
from hookbus.bus.groups.claims import MIN_LONG_IDLE, RETRY_CAP, heartbeat_every
from hookbus.bus.groups.registry import HEARTBEAT_EVERY, REFRESH_EVERY, REPLICA_TTL
from hookbus.bus.groups.trim import FORGET_AFTER, PRUNE_LUA, TRIM_EVERY, TRIM_LUA
from hookbus.bus.groups.versions import PIN_STALE, PUBLISH_EVERY, VERSION_PATTERN, VERSION_RULE
from hookbus.bus.keys import Keys
from hookbus.bus.settings import Settings
from hookbus.services.process.defaults import (
    WORKER_CLAIM_IDLE,
    WORKER_CONCURRENCY,
    WORKER_MAX_DELIVERIES,
)
from hookbus.services.worker.drain import PIN_SETTLE
from hookbus.services.worker.replica import DRAIN_SECONDS, REPLY_RETRY_GRACE


class Timings(BaseModel):
    """Seconds (counts where named so) a worker replica keeps to."""

    heartbeat_every: float = Field(description="Most seconds between two heartbeats; a replica beats every min(this, claim_idle / 4), at least every 0.05 s.")
    heartbeat_min: float = Field(description="Fewest seconds between two heartbeats.")
    replica_ttl: float = Field(description="A replica without a heartbeat for this long is not live; its heartbeat record expires after it.")
    registry_refresh: float = Field(description="Seconds between an orchestrator's reads of the registry.")
    serving_publish: float = Field(description="Seconds between an orchestrator's publications of its `serving:` counts.")
    pin_stale: float = Field(description="A pin in `serving:` not stamped again for this long no longer counts.")
    drain_pin_settle: float = Field(description="A draining last replica of its version, while another version takes new requests, serves at least this long (2 registry refreshes, a serving publication and a margin).")
    drain_limit: float = Field(description="Most seconds a replica told to stop waits for the requests pinned to its version, and then for its hops in flight.")
    claim_idle: float = Field(description="Default seconds of silence before a dead sibling's hops are claimed.")
    min_long_idle: float = Field(description="Entries pending longer than this are claimed whoever holds them.")
    retry_cap: float = Field(description="The longest pause between two reconnection attempts.")
    reply_retry_grace: float = Field(description="Seconds past a hop's deadline a reply is still retried through an outage.")
    trim_every: float = Field(description="Seconds between two trims of the streams a replica reads.")
    forget_after: float = Field(description="Seconds after which an idle consumer holding nothing is deleted.")
    max_deliveries: int = Field(description="Default deliveries of one hop before it is dead-lettered.")
    concurrency: int = Field(description="Default hops one replica runs at once.")


class SizeLimit(BaseModel):
    """One byte limit a worker applies to its replies, and the variable that changes it."""

    default: int
    env: str
    applies_to: str


class SizeLimits(BaseModel):
    max_hop_bytes: SizeLimit
    max_state_bytes: SizeLimit
    rule: str


class VersionStrings(BaseModel):
    """What a version (`--version`, HOOKBUS_WORKER_VERSION, a skill's `version`, a canary) may be."""

    pattern: str
    rule: str


class KeyNames(BaseModel):
    """The keys a worker touches, for the prefix `<prefix>` and one shard, on a single Redis
    (`plain`) and on a Redis Cluster (`cluster`: hash-tagged)."""

    plain: dict[str, str]
    cluster: dict[str, str]
    cluster_shards: int = Field(description="Shards of each sharded stream on a Redis Cluster when HOOKBUS_SHARDS is unset.")


class Scripts(BaseModel):
    """The Lua scripts every worker runs as they are: one text, so the workers cannot trim
    or forget differently."""

    trim_acked: str = Field(description="KEYS[1] a stream -> {entries removed, MINID or ''}: trims what every consumer group of the stream acknowledged, up to the oldest entry one still needs.")
    prune_consumers: str = Field(description="KEYS[1] a stream; ARGV its group, then consumer names -> how many of them were deleted: each only if it holds no pending entry.")


class ProtocolConstants(BaseModel):
    timings: Timings
    limits: SizeLimits
    version: VersionStrings
    keys: KeyNames
    scripts: Scripts


def _key_names(keys: Keys) -> dict[str, str]:
    group, version, replica, completion = "<group>", "<version>", "<replica>", "<completion_id>"
    return {
        "hooks": keys.hooks_shard(group, 0),
        "pinned_hooks": keys.pinned_hook_streams(group, version)[0],
        "observe": keys.observe_shard(group, 0),
        "events": keys.events_for(completion),
        "dead_letter": keys.dead_letter,
        "registry": keys.registry,
        "registry_version": keys.registry_version,
        "replicas": keys.replicas(group),
        "replica_heartbeat": keys.replica_heartbeat(group, replica),
        "replica_versions": keys.replica_versions(group),
        "serving": keys.serving(group, version),
    }


def _limit(name: str, applies_to: str) -> SizeLimit:
    field = Settings.model_fields[name]
    assert isinstance(field.default, int) and field.alias is not None
    return SizeLimit(default=field.default, env=field.alias, applies_to=applies_to)


def protocol_constants() -> ProtocolConstants:
    return ProtocolConstants(
        timings=Timings(
            heartbeat_every=HEARTBEAT_EVERY, heartbeat_min=heartbeat_every(0.0), replica_ttl=REPLICA_TTL,
            registry_refresh=REFRESH_EVERY, serving_publish=PUBLISH_EVERY, pin_stale=PIN_STALE,
            drain_pin_settle=PIN_SETTLE, drain_limit=DRAIN_SECONDS, claim_idle=WORKER_CLAIM_IDLE,
            min_long_idle=MIN_LONG_IDLE, retry_cap=RETRY_CAP, reply_retry_grace=REPLY_RETRY_GRACE,
            trim_every=TRIM_EVERY, forget_after=FORGET_AFTER, max_deliveries=WORKER_MAX_DELIVERIES,
            concurrency=WORKER_CONCURRENCY,
        ),
        limits=SizeLimits(
            max_hop_bytes=_limit("max_hop_bytes", "the bytes of a reply entry's field values (`e` and `d`)"),
            max_state_bytes=_limit("max_state_bytes", "the bytes of the reply's `state` as JSON"),
            rule=(
                "A worker measures each reply before it writes it: over either limit it writes instead a "
                "failure reply (`failure` names the variable) and nothing of the hooks' results. "
                "An orchestrator takes a reply entry over max_hop_bytes as a failed hop, whatever wrote it."
            ),
        ),
        version=VersionStrings(pattern=VERSION_PATTERN, rule=VERSION_RULE + "; the whole text, nothing trimmed"),
        keys=KeyNames(
            plain=_key_names(Keys("<prefix>:")), cluster=_key_names(Keys("<prefix>:", cluster=True)),
            cluster_shards=DEFAULT_CLUSTER_SHARDS,
        ),
        scripts=Scripts(trim_acked=TRIM_LUA, prune_consumers=PRUNE_LUA),
    )
