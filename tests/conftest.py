"""Shared fixtures: one real embedded Redis server per test session, a fresh key prefix per test.

Nothing here depends on a Redis already running on the machine.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from bus.embedded import EmbeddedRedis
from services.orchestrator.offline_server import shared_offline_base_url


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(appendonly=False)
    server.start()
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def redis_url(redis_server: EmbeddedRedis) -> str:
    return redis_server.url


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
