"""Bench: one Redis node against a 3-master Redis Cluster, the same hookbus stack on each.

Streamed requests (`[[words:20]]`, one remote no-op on_chunk hook: 21 hops each) go
through 2 `hookbus orchestrator` and 2 `hookbus worker` processes, 32 in flight, first on
one embedded redis-server, then on an embedded 3-master cluster (the same binary,
`cluster-enabled yes`). Per Redis node it reports CPU (seconds of CPU per second of
wall), commands processed (INFO stats) and the balance over the masters (the busiest
node's share against an even 1/3). On one 2-core machine the Python processes saturate
long before Redis does, so throughput is not where a cluster shows; the per-node CPU and
command counts are: they say how much of the Redis load each node carries.

Run alone: `python -m tests.bench.cluster`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import redis

from tests.bench.common import (
    Row,
    cpu_seconds,
    new_prefix,
    print_rows,
    processes,
    quiet_logs,
    run_load,
    scaled,
    wait_for_replicas,
)

PROMPT = "[[words:20]]"
EXPECTED = " ".join(f"w{n}" for n in range(20))
CONCURRENCY = 32


@dataclass
class NodeLoad:
    port: int
    cpu: float
    """CPU seconds per wall second while the load ran."""
    commands: int


@contextlib.contextmanager
def topology(kind: str) -> Iterator[tuple[str, list[int], str | None]]:
    """(REDIS_URL, the ports of the nodes that hold data, their password)."""
    if kind == "single":
        from hookbus.bus.connection.embedded import EmbeddedRedis

        server = EmbeddedRedis(appendonly=False)
        server.start()
        try:
            yield server.url, [server.port], server.password
        finally:
            server.cleanup()
        return
    from tests.embedded_cluster import EmbeddedCluster

    cluster = EmbeddedCluster(masters=3)
    cluster.start()
    try:
        yield cluster.url, cluster.master_ports(), None  # the embedded cluster runs without one
    finally:
        cluster.cleanup()


def node_counters(ports: list[int], password: str | None) -> dict[int, tuple[int, float, int]]:
    """port -> (pid, CPU seconds so far, commands processed so far)."""
    counters = {}
    for port in ports:
        with redis.Redis(port=port, password=password) as node:
            pid = int(node.info("server")["process_id"])
            counters[port] = (pid, cpu_seconds(pid), int(node.info("stats")["total_commands_processed"]))
    return counters


async def run_on(kind: str) -> tuple[float, list[NodeLoad], int]:
    """(requests per second, load per node, failures)."""
    from hookbus.bus.client import HookbusClient
    from tests.bench.full import wait_for_orchestrator

    prefix = new_prefix(f"cluster-{kind}")
    with topology(kind) as (url, ports, password):
        async with processes() as procs:
            for _ in range(2):
                procs.worker(url, prefix, "chunk", ["tests.bench.skills:ChunkNoop"], concurrency=32)
            await wait_for_replicas(url, prefix, {"chunk": 2}, procs)
            for _ in range(2):
                procs.orchestrator(url, prefix, "tests.bench.skills:sequential_stream_agent")
            client = HookbusClient(url, prefix=prefix, timeout=120)
            try:
                await wait_for_orchestrator(client, client.keys, procs)
                await asyncio.sleep(1.0)  # the orchestrators' registry views see the group

                async def request() -> None:
                    chunks = client.stream(PROMPT, auth={"scopes": ["chunky"]})
                    text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
                    if text != EXPECTED:
                        raise RuntimeError(f"unexpected answer {text!r}")

                await run_load(request, concurrency=CONCURRENCY, total=scaled(64))  # warm-up
                before = node_counters(ports, password)
                stats = await run_load(request, concurrency=CONCURRENCY, total=scaled(600), max_seconds=60)
                after = node_counters(ports, password)
            finally:
                await client.close()
    loads = [
        NodeLoad(port, (after[port][1] - before[port][1]) / stats.wall, after[port][2] - before[port][2])
        for port in ports
    ]
    return stats.rate, loads, stats.failures


async def measure(_url: str | None = None) -> list[Row]:
    quiet_logs()
    rows: list[Row] = []
    single_rate, single_nodes, single_failures = await run_on("single")
    cluster_rate, cluster_nodes, cluster_failures = await run_on("cluster")
    single = single_nodes[0]
    rows.append(Row("cluster", "1 node: requests/s", single_rate, "req/s", note=f"{single_failures} failed"))
    rows.append(
        Row("cluster", "3 masters: requests/s", cluster_rate, "req/s", single_rate, "1 node",
            note=f"{cluster_failures} failed; Python-bound on 2 cores")
    )
    rows.append(Row("cluster", "1 node: Redis CPU", single.cpu * 100, "% of a core"))
    rows.append(Row("cluster", "1 node: commands per request", single.commands / max(1, scaled(600)), "cmds"))
    total_commands = sum(n.commands for n in cluster_nodes)
    for index, node in enumerate(cluster_nodes):
        rows.append(
            Row("cluster", f"master {index + 1}: Redis CPU", node.cpu * 100, "% of a core", single.cpu * 100, "1 node")
        )
        rows.append(
            Row("cluster", f"master {index + 1}: share of commands", 100 * node.commands / total_commands, "%",
                note=f"{node.commands} commands")
        )
    busiest = max(n.commands for n in cluster_nodes) / total_commands
    rows.append(
        Row("cluster", "busiest master's share of commands", busiest * 100, "%", 100 / len(cluster_nodes),
            "an even share", target="<=1.3x", note="ratio 1.0 is a perfect spread")
    )
    rows.append(
        Row("cluster", "commands, 3 masters / 1 node", total_commands, "cmds", single.commands, "1 node",
            note="what sharding costs in round trips")
    )
    print_rows("cluster: one Redis node vs a 3-master Redis Cluster", rows)
    return rows


if __name__ == "__main__":
    asyncio.run(measure())
