"""The embedded Redis is not open to whoever finds its port, keeps its files private, and
starts on another port when the free one it chose was taken before it bound it."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest
import redis

from hookbus.bus.connection.embedded import EmbeddedRedis, ExitedAtStart, write_private


@pytest.fixture
def taken_port():
    """A port some other process listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_the_password_is_not_on_the_command_line_whatever_it_starts_with(tmp_path) -> None:
    """Any local user reads a process's arguments; and redis-server took a password that
    starts with "--" (1 in 4,096 of them) for an option, and did not start."""
    server = EmbeddedRedis(directory=tmp_path / "redis", appendonly=False)
    server.password = "--" + (server.password or "")
    try:
        server.start()
        assert server._process is not None
        command_line = Path(f"/proc/{server._process.pid}/cmdline").read_bytes()
        assert b"redis-server" in command_line and server.password.encode() not in command_line
        with redis.Redis.from_url(server.url) as owner:
            assert owner.ping()
        with redis.Redis(port=server.port, password=server.password[2:]) as guesser, pytest.raises(redis.AuthenticationError):
            guesser.ping()
    finally:
        server.cleanup()


def test_a_chosen_port_taken_before_the_server_binds_it_is_chosen_again(tmp_path, taken_port) -> None:
    server = EmbeddedRedis(directory=tmp_path / "redis", appendonly=False)
    server.port = taken_port  # the race: another process took the port it chose
    try:
        server.start()
        assert server.port != taken_port
        with redis.Redis.from_url(server.url) as owner:
            assert owner.ping()
        server.restart()  # a restart keeps the port its clients hold
        with redis.Redis.from_url(server.url) as owner:
            assert owner.ping()
    finally:
        server.cleanup()


def test_a_port_given_and_taken_fails_with_the_servers_log(tmp_path, taken_port) -> None:
    server = EmbeddedRedis(directory=tmp_path / "redis", appendonly=False, port=taken_port)
    try:
        with pytest.raises(ExitedAtStart, match="in use"):
            server.start()
        assert server.port == taken_port
    finally:
        server.cleanup()


def test_the_embedded_redis_needs_its_random_password_and_keeps_private_files(tmp_path) -> None:
    server = EmbeddedRedis(directory=tmp_path / "redis", appendonly=True)
    other = EmbeddedRedis(directory=tmp_path / "other", appendonly=False)
    try:
        server.start()
        other.start()
        assert server.password and len(server.password) >= 24 and server.password != other.password
        assert f":{server.password}@" in server.url
        with redis.Redis(port=server.port) as stranger, pytest.raises(redis.AuthenticationError):
            stranger.xadd("hookbus:requests", {"e": "{}"})  # the attack: enqueue as anyone
        with redis.Redis(port=server.port, password="guess") as guesser, pytest.raises(redis.AuthenticationError):
            guesser.ping()
        with redis.Redis.from_url(server.url) as owner:
            owner.set("k", "v")
            owner.execute_command("BGREWRITEAOF")
        files = [p for p in server.directory.rglob("*") if p.is_file()]
        assert files, "the server wrote no files"
        for path in files:
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, f"{path} is readable by others"
        assert stat.S_IMODE(server.directory.stat().st_mode) == 0o700
    finally:
        server.cleanup()
        other.cleanup()


def test_the_redis_url_file_is_only_readable_by_its_owner(tmp_path) -> None:
    path = tmp_path / "redis-url"
    path.write_text("old")
    path.chmod(0o644)
    write_private(path, "redis://:secret@127.0.0.1:1/0")
    assert path.read_text() == "redis://:secret@127.0.0.1:1/0"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
