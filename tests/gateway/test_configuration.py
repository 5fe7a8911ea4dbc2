"""Configuration fails closed: `hookbus gateway` refuses to start on a keys setting that would
silently turn auth off or share one identity, and says so when auth is off; `hookbus
settings` shows no secrets."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
GOOD_KEY = f"sk-{uuid.uuid4().hex}"


def gateway_cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hookbus.services.cli.main", "gateway", "--port", "0", *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture
def env(service_env: dict[str, str]) -> dict[str, str]:
    clean = dict(service_env)
    clean.pop("HOOKBUS_API_KEYS", None)
    return clean


def keys_file(tmp_path: Path, keys: object) -> str:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(keys))
    return str(path)


def test_an_empty_api_keys_option_is_an_error_not_auth_off(env):
    result = gateway_cli(env, "--api-keys", "")
    assert result.returncode == 2, result
    assert "--api-keys is empty" in result.stderr
    assert "AUTH IS OFF" not in result.stderr


def test_an_empty_api_keys_variable_is_an_error_not_auth_off(env):
    result = gateway_cli({**env, "HOOKBUS_API_KEYS": ""})
    assert result.returncode == 2, result
    assert "HOOKBUS_API_KEYS is set but empty" in result.stderr


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        ({GOOD_KEY: {"scopes": ["paid"]}}, "peer_user_id"),
        ({GOOD_KEY: {"peer_user_id": ""}}, "peer_user_id"),
        ({"sk-short": {"peer_user_id": "alice"}}, "shorter than 16"),
        ({"sk-alice": {"peer_user_id": "alice"}}, "placeholder"),
        ({"change-me-please-0123456789": {"peer_user_id": "alice"}}, "placeholder"),
        ({GOOD_KEY: {"peer_user_id": "alice", "rpm_limit": 0}}, "rpm_limit"),
    ],
    ids=["no-peer", "empty-peer", "short", "readme-example", "change-me", "zero-rpm"],
)
def test_a_keys_file_with_a_key_that_must_not_be_used_is_refused(env, tmp_path, keys, words):
    result = gateway_cli(env, "--api-keys", keys_file(tmp_path, keys))
    assert result.returncode == 2, result
    assert words in result.stderr, result.stderr


def test_the_shipped_example_keys_file_is_refused(env):
    example = REPO / "deploy" / "api-keys.example.json"
    result = gateway_cli(env, "--api-keys", str(example))
    assert result.returncode == 2, result
    assert "placeholder" in result.stderr
    result = gateway_cli({**env, "HOOKBUS_API_KEYS": example.read_text()})
    assert result.returncode == 2 and "placeholder" in result.stderr


def test_a_missing_keys_file_is_an_error(env, tmp_path):
    result = gateway_cli(env, "--api-keys", str(tmp_path / "nowhere.json"))
    assert result.returncode == 2 and "nowhere.json" in result.stderr


async def test_auth_off_is_said_on_stderr_at_start(env, unused_tcp_port):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hookbus.services.cli.main", "gateway", "--port", str(unused_tcp_port),
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    try:
        async def up() -> bool:
            try:
                async with httpx.AsyncClient() as http:
                    return (await http.get(f"http://127.0.0.1:{unused_tcp_port}/healthz")).status_code in (200, 503)
            except httpx.TransportError:
                return False

        assert await wait_for(up, timeout=30)
    finally:
        proc.terminate()
        async with asyncio.timeout(30):
            _, stderr = await proc.communicate()
    assert "AUTH IS OFF" in stderr.decode(), stderr


def test_settings_show_no_passwords_or_api_keys(env):
    secrets = {
        "REDIS_URL": "redis://default:hunter2-redis@redis.internal:6379/0",
        "OPENAI_BASE_URL": "https://proxy:hunter2-proxy@llm.internal/v1?password=hunter2-query",
        "OPENAI_API_KEY": "sk-hunter2-openai",
    }
    result = subprocess.run(
        [sys.executable, "-m", "hookbus.services.cli.main", "settings"],
        env={**env, **secrets}, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result
    assert "hunter2" not in result.stdout
    assert "redis://default:***@redis.internal:6379/0" in result.stdout
    assert "llm.internal/v1" in result.stdout
