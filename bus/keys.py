"""Names of every Redis key hookbus uses, under one configurable prefix.

On a single Redis (the default layout) the names are plain: `hookbus:requests`,
`hookbus:journal:<completion id>`, ... On a Redis Cluster (`cluster=True`, chosen by
hookbus.bus.connection.cluster.keys_for when the server says it is one) every key carries a hash
tag (hookbus.bus.connection.shards) so that what one atomic step touches shares a slot while the
load spreads over the nodes:

| keys | slot |
|---|---|
| requests shard, journal, responses, cancel marker of one request | its completion id's shard |
| hook-stream shard of a group a request's hops go to | the same shard |
| observer-stream shard of a group a request's observations go to | the same shard |
| events of one request | its completion id's shard |
| reply stream of one process | its instance name's shard |
| registry, its version, replica and orchestrator heartbeats, stats, observer drops | one slot, `{registry}` |
| replicas' versions, requests served per version, rollouts | the same slot |
| sessions, dead-letter | their own key |

Streams that are sharded (requests, each group's hook stream, events) are read in
every shard by their consumers. With one shard (`shards=1`, the single-Redis default)
`requests`, `hooks(group)` and `events` name the one stream; with more, naming "the"
stream is a mistake and raises, so a caller that forgot the shards fails loudly.

A prefix with a hash tag of its own (`{hookbus}:`) would put every key in one slot:
hookbus.bus.connection.cluster refuses it on a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from hookbus.bus.connection.shards import shard_of, shard_tags

ORCHESTRATOR_GROUP = "orchestrators"
REGISTRY_TAG = "{registry}"


class ShardedStreamError(LookupError):
    """A sharded stream was named as if it were one stream."""


def owner_segment(owner: str | None) -> str:
    """A principal as one key segment: percent-encoded, `@anonymous` for none."""
    return quote(owner, safe="") if owner else "@anonymous"


@dataclass(frozen=True)
class Keys:
    prefix: str = "hookbus:"
    shards: int = 1
    """How many shards the requests, hook and event streams have (HOOKBUS_SHARDS)."""
    cluster: bool = False
    """Hash-tagged names, for a Redis Cluster."""

    def __post_init__(self) -> None:
        shard_tags(self.shards)  # validates the count

    @property
    def tagged(self) -> bool:
        return self.cluster or self.shards > 1

    # ------------------------------------------------------------------ shards

    def shard_of(self, name: str) -> int:
        """The shard of a completion id or an instance name."""
        return shard_of(name, self.shards)

    def _tag(self, shard: int) -> str:
        return "{" + shard_tags(self.shards)[shard] + "}"

    def _sharded(self, kind: str, shard: int, name: str = "") -> str:
        """`<prefix><kind>[:<tag>][:<name>]`: the tag right after the kind, before any
        user-chosen name, so that a brace inside a name never becomes the hash tag."""
        tag = f":{self._tag(shard)}" if self.tagged else ""
        return f"{self.prefix}{kind}{tag}{':' + name if name else ''}"

    def _only(self, what: str) -> None:
        if self.shards > 1:
            raise ShardedStreamError(f"{what} has {self.shards} shards: name one (or all)")

    # ---------------------------------------------------------------- requests

    def requests_shard(self, shard: int) -> str:
        return self._sharded("requests", shard)

    def requests_for(self, completion_id: str) -> str:
        """The requests shard a request with this completion id is queued on."""
        return self.requests_shard(self.shard_of(completion_id))

    @property
    def request_streams(self) -> list[str]:
        return [self.requests_shard(s) for s in range(self.shards)]

    @property
    def requests(self) -> str:
        """The requests stream of an unsharded layout."""
        self._only("requests")
        return self.requests_shard(0)

    def journal(self, completion_id: str) -> str:
        return self._sharded("journal", self.shard_of(completion_id), completion_id)

    def responses(self, completion_id: str) -> str:
        return self._sharded("responses", self.shard_of(completion_id), completion_id)

    def cancel(self, completion_id: str) -> str:
        """String key whose existence means "cancel this request"; its value is the reason."""
        return self._sharded("cancel", self.shard_of(completion_id), completion_id)

    def memory_probe(self, completion_id: str) -> str:
        """A key never written, in the slot of the request's response stream: a client
        waiting for the answer asks it whether Redis refuses writes there (hookbus.bus.client)."""
        return self._sharded("memory-probe", self.shard_of(completion_id), completion_id)

    @property
    def cancel_channel(self) -> str:
        """Pub/sub channel; each message is the completion id of a request to cancel
        (cluster-wide: classic pub/sub reaches subscribers on every node)."""
        return f"{self.prefix}cancel"

    # ------------------------------------------------------------ hook streams

    def hooks_shard(self, group: str, shard: int) -> str:
        if not self.tagged:
            return f"{self.prefix}hooks:{group}"
        return self._sharded("hooks", shard, group)

    def hooks_for(self, group: str, completion_id: str) -> str:
        """The shard of `group`'s stream a request's hops go to: the request's own shard."""
        return self.hooks_shard(group, self.shard_of(completion_id))

    def hook_streams(self, group: str) -> list[str]:
        return [self.hooks_shard(group, s) for s in range(self.shards)]

    def hooks(self, group: str) -> str:
        """The hook stream of `group` in an unsharded layout."""
        self._only(f"hooks:{group}")
        return self.hooks_shard(group, 0)

    def pinned_hooks_for(self, group: str, version: str, completion_id: str) -> str:
        """The shard of the stream of `group` at `version` that a request pinned to that
        version sends its hops to (`hooks:{group}@{version}`; only that version's
        replicas read it: hookbus.bus.groups.versions)."""
        return self.hooks_for(f"{group}@{version}", completion_id)

    def pinned_hook_streams(self, group: str, version: str) -> list[str]:
        return self.hook_streams(f"{group}@{version}")

    # -------------------------------------------------------- observer streams

    def observe_shard(self, group: str, shard: int) -> str:
        """`group`'s observer stream (hookbus.bus.wire.observations), apart from its hook
        stream so that a backlog of observations never waits ahead of a hop."""
        if not self.tagged:
            return f"{self.prefix}observe:{group}"
        return self._sharded("observe", shard, group)

    def observe_for(self, group: str, completion_id: str) -> str:
        """The shard of `group`'s observer stream a request's observations go to: its own."""
        return self.observe_shard(group, self.shard_of(completion_id))

    def observe_streams(self, group: str) -> list[str]:
        return [self.observe_shard(group, s) for s in range(self.shards)]

    # ------------------------------------------------------ per-process streams

    def replies(self, instance: str) -> str:
        return self._sharded("replies", self.shard_of(instance), instance)

    def events_shard(self, shard: int) -> str:
        return self._sharded("events", shard)

    def events_for(self, completion_id: str) -> str:
        """The events shard a request's monitor records go to."""
        return self.events_shard(self.shard_of(completion_id))

    @property
    def event_streams(self) -> list[str]:
        return [self.events_shard(s) for s in range(self.shards)]

    @property
    def events(self) -> str:
        """The events stream of an unsharded layout."""
        self._only("events")
        return self.events_shard(0)

    @property
    def dead_letter(self) -> str:
        return f"{self.prefix}dead-letter"

    # ---------------------------------------------------------------- registry

    def _control(self, name: str) -> str:
        return f"{self.prefix}{REGISTRY_TAG}:{name}" if self.tagged else f"{self.prefix}{name}"

    @property
    def registry(self) -> str:
        """Hash: group name -> its announcement (hook and tool descriptors)."""
        return self._control("registry")

    @property
    def registry_version(self) -> str:
        return self._control("registry:version")

    def replicas(self, group: str) -> str:
        """Sorted set: replica name -> last heartbeat (unix seconds)."""
        return self._control(f"replicas:{group}")

    def replica_heartbeat(self, group: str, replica: str) -> str:
        """String: one replica's latest heartbeat record (ReplicaHeartbeat JSON), expiring on its own."""
        return self._control(f"replica:{group}:{replica}")

    def replica_versions(self, group: str) -> str:
        """Hash: replica name -> the version it runs and whether it drains (ReplicaInfo)."""
        return self._control(f"replica-versions:{group}")

    def serving(self, group: str, version: str) -> str:
        """Sorted set: completion id -> when it was pinned to `group` at `version`."""
        return self._control(f"serving:{group}@{version}")

    def rollout(self, group: str) -> str:
        """Hash: the canary version of `group` and the share of new requests it gets."""
        return self._control(f"rollout:{group}")

    @property
    def observe_dropped(self) -> str:
        """Hash: group -> observations its backlog bound dropped; `{group}:bytes` -> their bytes
        (hookbus.bus.groups.observer_backlog)."""
        return self._control("observe-dropped")

    @property
    def orchestrators(self) -> str:
        """Sorted set: orchestrator instance -> last heartbeat (unix seconds)."""
        return self._control("orchestrators")

    def key_usage(self, key_id: str) -> tuple[str, str]:
        """Sorted sets of one API key's requests in flight (id -> lease end, ms) and of its
        last minute (id -> start, ms), in one slot (hookbus.services.gateway.key_limits)."""
        name = "{" + key_id + "}" if self.tagged else key_id
        return f"{self.prefix}key-usage:{name}:parallel", f"{self.prefix}key-usage:{name}:minute"

    def session(self, owner: str | None, session_id: str) -> str:
        """One caller's session: the same id sent by two principals names two sessions.

        The owner is percent-encoded (it never contains `:`), so no pair of owner and id
        can spell another pair's key; callers without a principal share `@anonymous`,
        a name no encoded owner can take."""
        return f"{self.prefix}session:{owner_segment(owner)}:{session_id}"

    def stored_response(self, owner: str, response_id: str) -> str:
        """A stored Responses API response; `owner` is a digest of its principal, so the
        same id under another principal names another (absent) key."""
        return f"{self.prefix}stored-response:{owner}:{response_id}"

    def stored_bytes(self, owner: str) -> str:
        """Hash of the sizes (and expiry times) of one principal's stored responses."""
        return f"{self.prefix}stored-bytes:{owner}"

    def held_tool_results(self, key: str) -> str:
        """Server calls and results held for a client's next request ({peer}:{call id})."""
        return f"{self.prefix}held:{key}"

    @property
    def stats(self) -> str:
        """Hash of per-minute counters for `hookbus status` throughput."""
        return self._control("stats")
