"""A real 3-master Redis Cluster from the embedded redis-server, shared by the cluster tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.embedded_cluster import EmbeddedCluster


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[EmbeddedCluster]:
    cluster = EmbeddedCluster(masters=3)
    cluster.start()
    yield cluster
    cluster.cleanup()
