"""Names of every Redis key hookbus uses, under one configurable prefix.

With Redis Cluster, use a prefix with a hash tag (`{hookbus}:`) so that keys that one
operation touches together land in one slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ORCHESTRATOR_GROUP = "orchestrators"


def text(value: Any) -> str:
    """A Redis reply value as text (replies are bytes; redis-py types them loosely)."""
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Keys:
    prefix: str = "hookbus:"

    @property
    def requests(self) -> str:
        return f"{self.prefix}requests"

    def hooks(self, group: str) -> str:
        return f"{self.prefix}hooks:{group}"

    def replies(self, instance: str) -> str:
        return f"{self.prefix}replies:{instance}"

    def responses(self, completion_id: str) -> str:
        return f"{self.prefix}responses:{completion_id}"

    @property
    def events(self) -> str:
        return f"{self.prefix}events"

    @property
    def dead_letter(self) -> str:
        return f"{self.prefix}dead-letter"

    @property
    def registry(self) -> str:
        """Hash: group name -> its announcement (hook and tool descriptors)."""
        return f"{self.prefix}registry"

    @property
    def registry_version(self) -> str:
        return f"{self.prefix}registry:version"

    @property
    def registry_channel(self) -> str:
        """Pub/sub channel that tells orchestrators the registry changed."""
        return f"{self.prefix}registry:changed"

    def replicas(self, group: str) -> str:
        """Sorted set: replica name -> last heartbeat (unix seconds)."""
        return f"{self.prefix}replicas:{group}"

    @property
    def orchestrators(self) -> str:
        """Sorted set: orchestrator instance -> last heartbeat (unix seconds)."""
        return f"{self.prefix}orchestrators"

    def journal(self, completion_id: str) -> str:
        return f"{self.prefix}journal:{completion_id}"

    def session(self, session_id: str) -> str:
        return f"{self.prefix}session:{session_id}"

    @property
    def stats(self) -> str:
        """Hash of per-minute counters for `hookbus status` throughput."""
        return f"{self.prefix}stats"
