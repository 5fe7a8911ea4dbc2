"""The Docker engine the check runs on: the Debian packages it needs, and dockerd itself.

A daemon that already runs is used as it is; one this check started is stopped again at the
end, and only that one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.deploy.check.commands import CheckFailed, docker_cli, run

# Debian package -> a command it provides that the check needs.
PACKAGES = {
    "docker.io": "dockerd",
    "docker-compose": "docker-compose",
    "debootstrap": "debootstrap",
    "iptables": "iptables",
}
ENGINE_START_SECONDS = 90


def missing_packages() -> list[str]:
    return [package for package, command in PACKAGES.items() if not shutil.which(command)]


def install_packages() -> list[str]:
    """apt-get install what is missing (as root); returns what was installed."""
    missing = missing_packages()
    if not missing:
        return []
    if os.geteuid() != 0:
        raise CheckFailed(f"missing {missing}: run as root or `apt-get install {' '.join(missing)}`")
    quiet = {"DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-q"], env=quiet, timeout=600)
    run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], env=quiet, timeout=900)
    return missing


def engine_answers() -> bool:
    return run([docker_cli(), "info", "--format", "{{.ServerVersion}}"], check=False, timeout=30).returncode == 0


@contextlib.contextmanager
def docker_engine() -> Iterator[str]:
    """Yields how the engine was found ("running" or "started"); stops it only if started here."""
    if engine_answers():
        yield "running"
        return
    log = Path(tempfile.mkdtemp(prefix="hookbus-dockerd-")) / "dockerd.log"
    with log.open("wb") as out:
        daemon = subprocess.Popen(["dockerd"], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + ENGINE_START_SECONDS
        while not engine_answers():
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise CheckFailed(f"dockerd did not start; its log: {log}")
            time.sleep(1)  # poll interval of this condition wait
        yield "started"
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
