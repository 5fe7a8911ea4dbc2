"""Worker versions on a real Redis: a replica announces its version and hooks, and two
replicas announcing one version with different hooks is reported."""

from __future__ import annotations

from structlog.testing import capture_logs

from hookbus.bus.connection.cluster import keys_for
from hookbus.bus.connection.retrying import connect
from hookbus.bus.groups.versions import ReplicaInfo
from hookbus.services.worker.host import GroupHost
from hookbus.services.worker.replica import WorkerReplica
from tests.unit.test_versions import Guard, GuardReordered


async def test_a_second_replica_with_the_same_version_and_other_hooks_is_reported(redis_url, prefix):
    first = WorkerReplica(GroupHost("guard", [Guard()]), redis_url, prefix=prefix, replica="g-1", version="v1")
    second = WorkerReplica(GroupHost("guard", [GuardReordered()]), redis_url, prefix=prefix, replica="g-2", version="v1")
    await first.start()
    try:
        with capture_logs() as logs:
            await second.start()
        await second.stop()
    finally:
        await first.stop()
    [reported] = [e for e in logs if e["event"] == "version_hooks_differ"]
    assert reported["version"] == "v1" and reported["sibling"] == "g-1"
    assert reported["hooks"] != reported["sibling_hooks"]


async def test_a_stopped_replica_leaves_its_group_and_its_consumer_at_once(redis_url, prefix):
    keys = keys_for(redis_url, prefix)
    replica = WorkerReplica(GroupHost("guard", [Guard()]), redis_url, prefix=prefix, replica="g-1", version="v1")
    client = connect(redis_url)
    await replica.start()
    info = ReplicaInfo.model_validate_json(await client.hget(keys.replica_versions("guard"), "g-1"))
    assert (info.version, info.draining) == ("v1", False)
    assert await client.zscore(keys.replicas("guard"), "g-1") is not None
    stream = keys.pinned_hooks_for("guard", "v1", "")
    # as its first delivery would (a blocked XREADGROUP that got nothing creates no consumer)
    await client.execute_command("XGROUP", "CREATECONSUMER", stream, "guard", "g-1")
    await replica.stop()
    assert await client.hget(keys.replica_versions("guard"), "g-1") is None
    assert await client.zscore(keys.replicas("guard"), "g-1") is None
    assert await client.xinfo_consumers(stream, "guard") == []
    await client.aclose()
