"""Operations on a live cluster under load: a master failover and a slot migration.

Both keep every request answered: the clients follow MOVED and ASK, back off through
CLUSTERDOWN / READONLY / connection errors while the replica takes over, and no read
loop spins (each shard's loop backs off alone).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from hookbus import Agent
from hookbus.bus.client import HookbusClient
from hookbus.bus.connection.shards import slot_of
from hookbus.skills import HookbusError
from tests.cluster.skills import Ledger
from tests.embedded_cluster import EmbeddedCluster
from tests.integration.stack import Upper, running_stack

pytestmark = pytest.mark.slow

PROMPT = "[[delay:25]] [[words:16]]"
EXPECTED = " ".join(f"W{n}" for n in range(16))


@pytest.fixture(scope="module")
def replicated_cluster() -> Iterator[EmbeddedCluster]:
    cluster = EmbeddedCluster(masters=3, replicas=1, node_timeout_ms=1000)
    cluster.start()
    yield cluster
    cluster.cleanup()


async def one_request(client: HookbusClient) -> tuple[str, str | None]:
    """(text, error code or None); raises nothing: every request must end."""
    try:
        text = "".join([c.choices[0].delta.content or "" async for c in client.stream(PROMPT) if c.choices])
    except HookbusError as exc:
        return "", exc.code
    return text, None


async def load_during(client: HookbusClient, operation: Any, *, waves: int = 6, per_wave: int = 12) -> list[tuple[str, str | None]]:
    """Waves of concurrent streamed requests; `operation` (blocking) runs in a thread
    after the first wave started."""
    results: list[tuple[str, str | None]] = []
    running_operation = None
    for wave in range(waves):
        batch = asyncio.gather(*(one_request(client) for _ in range(per_wave)))
        if wave == 1:
            running_operation = asyncio.create_task(asyncio.to_thread(operation))
        results += await batch
    assert running_operation is not None
    await running_operation
    results += await asyncio.gather(*(one_request(client) for _ in range(per_wave)))
    return results


async def test_a_master_failover_under_load_ends_every_request_and_finalize_ran(
    replicated_cluster: EmbeddedCluster, prefix: str
) -> None:
    ledger = Ledger()
    agent = Agent("cluster", skills=[ledger])
    master = replicated_cluster.master_ports()[0]
    replica = replicated_cluster.replica_of(master)
    async with running_stack(replicated_cluster.url, prefix, agent, {"shout": [Upper()]}, claim_idle=2.0) as (client, services, workers):
        results = await load_during(client, lambda: replicated_cluster.failover(replica))
        reader_errors = sum(w._reader.errors for w in workers if w._reader) + sum(
            s._reader.errors for s in services if s._reader
        )
    assert replica in replicated_cluster.master_ports() and master not in replicated_cluster.master_ports()
    # every request ended; nearly all of them with the full answer
    assert len(results) == 7 * 12
    answered = [text for text, error in results if error is None]
    assert len(answered) >= 0.9 * len(results), [e for _, e in results if e]
    assert all(text == EXPECTED for text in answered)
    # finalize ran once for each of them
    assert len(ledger.finalized) == len(results) == len({cid for cid, _ in ledger.finalized})
    # the read loops backed off while the master was away instead of spinning
    assert reader_errors < 200, reader_errors


async def test_a_slot_migration_under_load_answers_every_request(
    replicated_cluster: EmbeddedCluster, prefix: str
) -> None:
    ledger = Ledger()
    agent = Agent("cluster", skills=[ledger])
    async with running_stack(replicated_cluster.url, prefix, agent, {"shout": [Upper()]}) as (client, _, _):
        shard_slots = [slot_of(stream) for stream in client.keys.request_streams]
        slot = shard_slots[0]
        source = replicated_cluster.master_of_slot(slot)
        target = next(p for p in replicated_cluster.master_ports() if p != source)
        moved: list[int] = []
        results = await load_during(client, lambda: moved.append(replicated_cluster.migrate_slot(slot, target)))
    assert replicated_cluster.master_of_slot(slot) == target
    assert moved and moved[0] >= 2  # the requests shard and the hook stream shard at least
    assert [error for _, error in results] == [None] * len(results)
    assert all(text == EXPECTED for text, _ in results)
    assert len(ledger.finalized) == len(results)
