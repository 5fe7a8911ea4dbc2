"""What a running `hookbus run` leaves in `.hookbus/` for the other commands of the same folder.

One folder holds one stack: `hookbus run` takes `.hookbus/run.pid` (its pid) before it starts
anything, and a second `hookbus run` in the same folder refuses while that pid lives, rather
than overwrite the first one's Redis URL and open its Redis data directory. A file left by a
stack that died (kill -9, a crash) is stale: the pid is gone, so the next `hookbus run` takes
the folder over and the other commands (`hookbus send`, `status`, `HookbusClient()`) ignore the
dead URL instead of timing out against it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from hookbus.bus.connection.embedded import write_private
from hookbus.bus.settings import get_settings

STATE_DIR = Path(".hookbus")


class StackRunning(RuntimeError):
    """Another live `hookbus run` owns this folder's `.hookbus/`."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _owner(directory: Path) -> int | None:
    """The pid of the live `hookbus run` that owns `directory`, else None."""
    try:
        pid = int((directory / "run.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _pid_alive(pid) else None


def claim(directory: Path = STATE_DIR) -> None:
    """Make this process the owner of `directory`, or raise StackRunning."""
    directory.mkdir(exist_ok=True)
    owner = _owner(directory)
    if owner is not None and owner != os.getpid():
        raise StackRunning(
            f"another `hookbus run` (pid {owner}) runs from {directory.resolve()}; stop it "
            "first, or start this one from another folder (each folder holds one stack)"
        )
    (directory / "redis-url").unlink(missing_ok=True)  # a dead stack's URL
    write_private(directory / "run.pid", str(os.getpid()))


def publish(redis_url: str, directory: Path = STATE_DIR) -> None:
    """Tell the folder's other commands where this stack's Redis is (the URL holds a password)."""
    write_private(directory / "redis-url", redis_url)


def release(directory: Path = STATE_DIR) -> None:
    for name in ("redis-url", "run.pid"):
        with contextlib.suppress(OSError):
            (directory / name).unlink()


def redis_url(directory: Path = STATE_DIR) -> str | None:
    """REDIS_URL, else the Redis of this folder's live `hookbus run`, else None."""
    return get_settings().redis_url or running_stack_url(directory)


def running_stack_url(directory: Path = STATE_DIR) -> str | None:
    """The Redis URL of the live `hookbus run` of this folder, or None (none, or it died)."""
    if _owner(directory) is None:
        return None
    try:
        return (directory / "redis-url").read_text().strip() or None
    except OSError:
        return None
