"""A signal sent to the command a user started stops the TypeScript worker, as it stops
`hookbus worker`: `npx hookbus-worker` runs node under `sh -c`, so a SIGTERM to npx used
to end npx and the shell while node served on, re-parented to pid 1, its hooks still
changing requests. Now node drains and exits, and its replica leaves the group."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aredis

from hookbus.bus.keys import Keys
from tests.typescript.conftest import PACKAGE, require_built_package, require_node
from tests.waiting import wait_for


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (from /proc: parent links)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def test_sigterm_to_npx_drains_and_stops_the_node_worker(redis_url: str, prefix: str, tmp_path: Path) -> None:
    require_node()
    npx = shutil.which("npx")
    if npx is None:
        pytest.skip("npx is not installed")
    require_built_package()
    group = f"npx-{uuid.uuid4().hex[:6]}"
    keys = Keys(prefix)
    env = {**os.environ, "REDIS_URL": redis_url, "HOOKBUS_PREFIX": prefix, "HOOKBUS_LOG_LEVEL": "info"}
    log = (tmp_path / "worker.log").open("wb")
    started = await asyncio.create_subprocess_exec(
        npx, "--prefix", str(PACKAGE), "hookbus-worker", "--group", group, str(PACKAGE / "conformance" / "probe.ts"),
        env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    client = aredis.Redis.from_url(redis_url)
    node: list[int] = []
    try:
        assert await wait_for(lambda: client.zcard(keys.replicas(group)), timeout=90), (tmp_path / "worker.log").read_text()

        async def the_node() -> list[int]:
            return [p for p in descendants(started.pid) if "hookbus-worker" in command_line(p) and "node" in command_line(p)]

        node = await wait_for(the_node, timeout=10)
        assert node, [command_line(p) for p in descendants(started.pid)]
        started.send_signal(signal.SIGTERM)
        await asyncio.wait_for(started.wait(), 30)

        async def node_gone() -> bool:
            return not any(alive(p) for p in node)

        assert await wait_for(node_gone, timeout=45), (tmp_path / "worker.log").read_text()[-3000:]
        assert await client.zcard(keys.replicas(group)) == 0
        assert not await client.hlen(keys.replica_versions(group))
        assert b"worker_stopped" in (tmp_path / "worker.log").read_bytes()
    finally:
        await client.aclose()
        for pid in node:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if started.returncode is None:
            started.kill()
        log.close()
