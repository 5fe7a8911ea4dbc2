"""The key layout on a Redis Cluster: what one atomic step touches shares a slot, the
load spreads over the slots, and a single Redis keeps its plain names."""

from __future__ import annotations

import random
import uuid
from collections import Counter

import pytest

from hookbus.bus.connection.shards import DEFAULT_CLUSTER_SHARDS, SLOTS, shard_tags, slot_of
from hookbus.bus.keys import Keys, ShardedStreamError

CLUSTER = Keys("hookbus:", shards=DEFAULT_CLUSTER_SHARDS, cluster=True)


def test_a_single_redis_keeps_the_plain_names() -> None:
    keys = Keys("hookbus:")
    assert keys.requests == "hookbus:requests" == keys.requests_for("chatcmpl-1")
    assert keys.request_streams == ["hookbus:requests"]
    assert keys.journal("chatcmpl-1") == "hookbus:journal:chatcmpl-1"
    assert keys.responses("chatcmpl-1") == "hookbus:responses:chatcmpl-1"
    assert keys.cancel("chatcmpl-1") == "hookbus:cancel:chatcmpl-1"
    assert keys.hooks("guard") == "hookbus:hooks:guard" == keys.hooks_for("guard", "chatcmpl-1")
    assert keys.replies("orch-1") == "hookbus:replies:orch-1"
    assert keys.events == "hookbus:events" == keys.events_for("orch-1")
    assert keys.registry == "hookbus:registry"
    assert keys.replicas("guard") == "hookbus:replicas:guard"
    assert keys.replica_heartbeat("guard", "w-1") == "hookbus:replica:guard:w-1"
    assert keys.observe_for("telemetry", "chatcmpl-1") == "hookbus:observe:telemetry"
    assert keys.observe_streams("telemetry") == ["hookbus:observe:telemetry"]


# Seeded, so every pytest-xdist worker collects the same 50 ids.
_IDS = random.Random(34)
_COMPLETION_IDS = ["chatcmpl-" + f"{_IDS.getrandbits(128):032x}" for _ in range(50)]


@pytest.mark.parametrize("completion_id", [*_COMPLETION_IDS, "odd{id}x", "{}"])
def test_every_key_of_one_request_is_in_one_slot(completion_id: str) -> None:
    """The journal scripts touch the requests shard, journal, responses and cancel
    marker together; a hop goes to the hook-stream shard on the same node."""
    slots = {
        slot_of(CLUSTER.requests_for(completion_id)),
        slot_of(CLUSTER.journal(completion_id)),
        slot_of(CLUSTER.responses(completion_id)),
        slot_of(CLUSTER.cancel(completion_id)),
        slot_of(CLUSTER.hooks_for("guard", completion_id)),
        slot_of(CLUSTER.hooks_for("telemetry", completion_id)),
        slot_of(CLUSTER.observe_for("telemetry", completion_id)),
    }
    assert len(slots) == 1


def test_the_registry_is_in_one_slot() -> None:
    keys = [CLUSTER.registry, CLUSTER.registry_version, CLUSTER.orchestrators, CLUSTER.stats,
            CLUSTER.replicas("guard"), CLUSTER.replicas("telemetry"),
            CLUSTER.replica_heartbeat("guard", "w-1"), CLUSTER.replica_heartbeat("telemetry", "w-2")]
    assert len({slot_of(k) for k in keys}) == 1


@pytest.mark.parametrize("masters", [1, 2, 3, 4, 6, 12])
def test_shards_are_spread_evenly_over_masters_with_equal_slot_ranges(masters: int) -> None:
    """What `redis-cli --cluster create` builds: master m owns the m-th equal range."""
    per_master = Counter(slot_of(CLUSTER.requests_shard(s)) * masters // SLOTS for s in range(CLUSTER.shards))
    assert sorted(per_master.values()) == [DEFAULT_CLUSTER_SHARDS // masters] * masters


def test_requests_spread_over_the_shards() -> None:
    shards = Counter(CLUSTER.shard_of(f"chatcmpl-{uuid.uuid4().hex}") for _ in range(2400))
    assert len(shards) == DEFAULT_CLUSTER_SHARDS
    assert min(shards.values()) > 100 and max(shards.values()) < 300  # 200 each on average


def test_per_process_streams_and_sharded_streams_are_distinct_slots() -> None:
    assert len({slot_of(s) for s in CLUSTER.request_streams}) == DEFAULT_CLUSTER_SHARDS
    assert len({slot_of(s) for s in CLUSTER.event_streams}) == DEFAULT_CLUSTER_SHARDS
    assert len({slot_of(CLUSTER.replies(f"orchestrator-host-{pid}")) for pid in range(60)}) > 6


def test_naming_a_sharded_stream_as_one_stream_fails_loudly() -> None:
    with pytest.raises(ShardedStreamError):
        _ = CLUSTER.requests
    with pytest.raises(ShardedStreamError):
        CLUSTER.hooks("guard")
    with pytest.raises(ShardedStreamError):
        _ = CLUSTER.events


def test_shard_counts_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError):
        shard_tags(0)
    with pytest.raises(ValueError):
        Keys("hookbus:", shards=1000, cluster=True)
