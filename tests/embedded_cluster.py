"""A real Redis Cluster from the embedded redis-server binary, for tests and benchmarks.

N masters (and optionally replicas) of the same `redis-server` hookbus embeds
(hookbus.bus.connection.embedded), in cluster mode on loopback ports, joined the way an operator
would (CLUSTER MEET, ADDSLOTS in equal contiguous ranges as `redis-cli --cluster
create` assigns them, REPLICATE). It can also do to a live cluster what operations do:
fail a master over to its replica, kill a master, migrate a slot to another master.
"""

from __future__ import annotations

import random
import shutil
import socket
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis

from hookbus.bus.connection.embedded import EmbeddedRedis
from hookbus.bus.connection.shards import SLOTS


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too and below 65536."""
    while True:
        port = random.randint(20000, 50000)
        if all(_free(p) for p in (port, port + 10000)):
            return port


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class ClusterNode:
    """One node as CLUSTER NODES describes it."""

    def __init__(self, line: str) -> None:
        fields = line.split()
        self.id = fields[0]
        self.port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
        flags = fields[2].split(",")
        self.master = "master" in flags
        self.failed = "fail" in flags or "fail?" in flags
        self.master_id = fields[3] if fields[3] != "-" else None
        self.slots = [part for part in fields[8:] if not part.startswith("[")]


class EmbeddedCluster:
    def __init__(
        self, *, masters: int = 3, replicas: int = 0, node_timeout_ms: int = 1000
    ) -> None:
        """`replicas` per master; `node_timeout_ms` is how soon a dead master is failed over."""
        self.directory = Path(tempfile.mkdtemp(prefix="hookbus-cluster-")).resolve()
        self.masters_wanted = masters
        self.replicas_wanted = replicas
        self.servers: dict[int, EmbeddedRedis] = {}
        for index in range(masters * (1 + replicas)):
            port = cluster_port()
            self.servers[port] = EmbeddedRedis(
                port=port,
                directory=self.directory / f"node-{index}",
                appendonly=False,
                auth=False,  # nodes and their test clients talk without a password
                extra_args=[
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(node_timeout_ms),
                    "--cluster-replica-validity-factor", "0",  # any replica may take over
                    "--cluster-require-full-coverage", "no",
                ],
            )

    @property
    def ports(self) -> list[int]:
        return list(self.servers)

    @property
    def url(self) -> str:
        """REDIS_URL for hookbus: one node; the client finds the others."""
        return self.node_url(self.ports[0])

    def node_url(self, port: int) -> str:
        return f"redis://127.0.0.1:{port}/0"

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_connect_timeout=1, socket_timeout=5)

    # ------------------------------------------------------------------ set-up

    def start(self, timeout: float = 30.0) -> str:
        for server in self.servers.values():
            server.start()
        first, *others = self.ports
        for port in others:
            with self.client(port) as node:
                node.execute_command("CLUSTER", "MEET", "127.0.0.1", first)
        masters = self.ports[: self.masters_wanted]
        for index, port in enumerate(masters):
            low = index * SLOTS // len(masters)
            high = (index + 1) * SLOTS // len(masters)
            with self.client(port) as node:
                node.execute_command("CLUSTER", "ADDSLOTS", *range(low, high))
        self._wait(lambda: all(self._knows_all(p) for p in self.ports), timeout, "nodes to meet")
        replicas = self.ports[self.masters_wanted :]
        for index, port in enumerate(replicas):
            master_id = self.node_id(masters[index % len(masters)])
            with self.client(port) as node:
                node.execute_command("CLUSTER", "REPLICATE", master_id)
        self.wait_healthy(timeout)
        return self.url

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until every live node says `cluster_state:ok` and agrees on the masters."""
        self._wait(self._healthy, timeout, "the cluster to be healthy")

    def _healthy(self) -> bool:
        views = []
        for port, server in self.servers.items():
            if not server.running:
                continue
            try:
                with self.client(port) as node:
                    if node.cluster("info").get("cluster_state") != "ok":
                        return False
                    views.append(sorted(n.port for n in self._nodes_of(node) if n.master and n.slots and not n.failed))
            except redis.RedisError:
                return False
        expected_replicas = self.replicas_wanted * self.masters_wanted
        if expected_replicas and not self._replicas_synced(expected_replicas):
            return False
        return len({tuple(v) for v in views}) == 1

    def _replicas_synced(self, expected: int) -> bool:
        """Every replica a replica already (a node told to replicate may still say master)
        and linked to its master."""
        replicas = 0
        for port, server in self.servers.items():
            if not server.running:
                continue
            with self.client(port) as node:
                info = node.info("replication")
                if info.get("role") == "slave":
                    if info.get("master_link_status") != "up":
                        return False
                    replicas += 1
        return replicas >= expected

    def _knows_all(self, port: int) -> bool:
        with self.client(port) as node:
            return int(node.cluster("info").get("cluster_known_nodes", 0)) == len(self.servers)

    @staticmethod
    def _wait(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if condition():
                    return
            except redis.RedisError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")

    # ------------------------------------------------------------ inspection

    def _nodes_of(self, node: redis.Redis) -> list[ClusterNode]:
        raw = node.execute_command("CLUSTER", "NODES")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return [ClusterNode(line) for line in text.strip().splitlines()]

    def nodes(self) -> list[ClusterNode]:
        port = next(p for p, s in self.servers.items() if s.running)
        with self.client(port) as node:
            return self._nodes_of(node)

    def node_id(self, port: int) -> str:
        with self.client(port) as node:
            return str(node.execute_command("CLUSTER", "MYID").decode())

    def master_ports(self) -> list[int]:
        return sorted(n.port for n in self.nodes() if n.master and n.slots and not n.failed)

    def replica_of(self, master_port: int) -> int:
        master_id = self.node_id(master_port)
        return next(n.port for n in self.nodes() if n.master_id == master_id and not n.failed)

    def master_of_slot(self, slot: int) -> int:
        with self.client(self.master_ports()[0]) as node:
            for low, high, (_host, port, *_rest), *_replicas in node.execute_command("CLUSTER", "SLOTS"):
                if low <= slot <= high:
                    return int(port)
        raise LookupError(f"no master serves slot {slot}")

    # --------------------------------------------------------------- operations

    def failover(self, replica_port: int, timeout: float = 30.0) -> None:
        """A planned failover: the replica takes over its master's slots."""
        with self.client(replica_port) as node:
            node.execute_command("CLUSTER", "FAILOVER")
        self._wait(lambda: replica_port in self.master_ports(), timeout, "the failover")
        self.wait_healthy(timeout)

    def kill(self, port: int) -> None:
        """A crash (SIGKILL) of one node."""
        self.servers[port].stop(kill=True)

    def migrate_slot(self, slot: int, to_port: int, batch: int = 100) -> int:
        """Move one slot, keys and all, to another master while clients keep using it
        (they get ASK, then MOVED); returns the number of keys moved."""
        from_port = self.master_of_slot(slot)
        if from_port == to_port:
            return 0
        source, target = self.client(from_port), self.client(to_port)
        moved = 0
        try:
            source_id, target_id = self.node_id(from_port), self.node_id(to_port)
            target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            while keys := source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
                source.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
            for port in self.master_ports():
                with self.client(port) as node:
                    node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        finally:
            source.close()
            target.close()
        return moved

    # ----------------------------------------------------------------- teardown

    def cleanup(self) -> None:
        for server in self.servers.values():
            server.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> EmbeddedCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
