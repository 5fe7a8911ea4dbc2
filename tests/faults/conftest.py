"""Fixtures of the fault tests: real subprocesses (tests/integration/processes.py) and a
plain async Redis client on the test's server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aredis

from hookbus.bus.connection.embedded import EmbeddedRedis
from hookbus.bus.keys import Keys
from tests.integration.processes import Processes


@pytest.fixture
def procs(service_env: dict[str, str], tmp_path, request) -> Iterator[Processes]:
    processes = Processes(service_env, tmp_path / "logs")
    yield processes
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        print(processes.logs(lines=60))
    processes.close()


@pytest.fixture
def own_redis(tmp_path, request) -> Iterator[EmbeddedRedis]:
    """A redis-server of the test's own, to restart: with AOF, or without persistence
    when parametrized (indirect) with False."""
    server = EmbeddedRedis(directory=tmp_path / "redis", appendonly=getattr(request, "param", True))
    server.start()
    yield server
    server.cleanup()


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aredis.Redis]:
    client = aredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def keys(prefix: str) -> Keys:
    return Keys(prefix)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
