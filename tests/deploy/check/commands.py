"""Running the host's commands: docker, compose, apt, with their output kept for the report."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


class CheckFailed(Exception):
    """A step's expectation did not hold; the message says what was seen."""


def run(
    argv: Sequence[str | Path],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 600,
    check: bool = True,
    stdin: bytes | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command to its end; a non-zero exit raises CheckFailed with its stderr tail."""
    result = subprocess.run(
        [str(part) for part in argv],
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=timeout,
        capture_output=True,
        input=stdin.decode() if stdin is not None else None,
        text=True,
    )
    if check and result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-15:]
        raise CheckFailed(f"{' '.join(map(str, argv[:4]))} ... exited {result.returncode}:\n" + "\n".join(tail))
    return result


def docker_cli() -> str:
    """Debian's docker.io client when present: its 20.10 `docker build` has BuildKit built in
    (`--secret`), where a newer client without the buildx plugin falls back to the legacy builder."""
    if Path("/usr/bin/docker").exists():
        return "/usr/bin/docker"
    found = shutil.which("docker")
    if not found:
        raise CheckFailed("no docker client; install Debian's docker.io")
    return found


def compose_cli() -> list[str]:
    """Compose v1 (Debian's docker-compose 1.29) or the `docker compose` plugin."""
    found = shutil.which("docker-compose")
    if found:
        return [found]
    if run([docker_cli(), "compose", "version"], check=False).returncode == 0:
        return [docker_cli(), "compose"]
    raise CheckFailed("no compose: install Debian's docker-compose")
