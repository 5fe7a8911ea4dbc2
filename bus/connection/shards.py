"""Shards: which Redis Cluster slot each hookbus key lands in, and how work is spread.

On a Redis Cluster every key is hashed to one of 16384 slots (by the part between the
first `{` and `}` when there is one, the hash tag); a script or a transaction may only
touch keys of one slot. hookbus puts a request's keys (its requests-stream shard, journal,
response stream, cancel marker and hook-stream shards) under one shard tag chosen by its
completion id, so the journal scripts stay atomic while requests spread over the nodes.

The tags are chosen so that their slots are evenly spaced over the slot range: a cluster
whose masters own equal contiguous ranges (what `redis-cli --cluster create` makes) then
holds an equal number of shards on each master when the shard count is a multiple of
the master count (the default 12 divides evenly for 1, 2, 3, 4, 6 and 12 masters).

Every process of one deployment must use the same shard count (HOOKBUS_SHARDS): a
request is written to the shard its completion id names, and read by processes that
read every shard they know of.
"""

from __future__ import annotations

import zlib
from functools import cache

from redis.crc import key_slot

SLOTS = 16384
DEFAULT_CLUSTER_SHARDS = 12
MAX_SHARDS = 256


@cache
def shard_tags(count: int) -> tuple[str, ...]:
    """One hash tag per shard, the n-th one hashing into the n-th equal part of the slots."""
    if not 1 <= count <= MAX_SHARDS:
        raise ValueError(f"shard count must be between 1 and {MAX_SHARDS}, not {count}")
    tags = []
    for shard in range(count):
        low, high = -(-shard * SLOTS // count), -(-(shard + 1) * SLOTS // count)
        attempt = 0
        while not low <= key_slot(f"s{shard}.{attempt}".encode()) < high:
            attempt += 1
        tags.append(f"s{shard}.{attempt}")
    return tuple(tags)


def shard_of(name: str, count: int) -> int:
    """The shard a completion id (or an instance name) belongs to: stable everywhere."""
    return zlib.crc32(name.encode()) % count if count > 1 else 0


def slot_of(key: str) -> int:
    """The cluster slot of a key (redis-py's CRC16 with hash tags)."""
    return int(key_slot(key.encode()))
