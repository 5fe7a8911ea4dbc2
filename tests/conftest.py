"""Shared fixtures: one real Redis server per test session, a fresh key prefix per test.

By default the session starts its own embedded Redis, so nothing depends on a Redis
already running on the machine. `HOOKBUS_TEST_REDIS_URL=redis://host:port/0` runs the
suite against an outside Redis or Valkey instead (the fault tests that restart the
server keep their own embedded one).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from hookbus.bus.connection.embedded import EmbeddedRedis
from hookbus.services.testing.offline_server import shared_offline_base_url


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    outside = os.environ.get("HOOKBUS_TEST_REDIS_URL")
    if outside:
        yield outside
        return
    server = EmbeddedRedis(appendonly=False)
    server.start()
    yield server.url
    server.cleanup()


@pytest.fixture
def prefix() -> str:
    """A key prefix of its own, so tests sharing the server never see each other's streams."""
    return f"t{uuid.uuid4().hex[:10]}:"


@pytest.fixture(scope="session")
def offline_llm_url() -> str:
    """The built-in offline model's base URL (real HTTP on loopback)."""
    return shared_offline_base_url()


@pytest.fixture
def service_env(redis_url: str, prefix: str, offline_llm_url: str) -> dict[str, str]:
    """Environment for hookbus subprocesses of this test."""
    env = dict(os.environ)
    env.update(
        REDIS_URL=redis_url,
        HOOKBUS_PREFIX=prefix,
        OPENAI_BASE_URL=offline_llm_url,
        HOOKBUS_LOG_FORMAT="json",
        PYTHONUNBUFFERED="1",
    )
    return env
