"""A TypeScript worker group (`hookbus-worker`, Node.js) beside a Python one, an
orchestrator and the gateway, each a real process on the session's Redis, as a user runs
them. The TypeScript group hosts the lifecycle page's examples
(tests/typescript/skills/lifecycle_examples.ts) and tests/typescript/skills/extras.ts;
the Python group hosts tests/typescript/py_skills.py. Both append each hook call to one
journal file (HOOKBUS_TS_JOURNAL), which the tests read.

Skipped only when `node` is missing. The package must be built (`make ts-deps`, which
`make test` runs first): the tests install nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.processes import REPO, Proc, Processes, free_port
from tests.waiting import wait_for

PACKAGE = REPO / "skills" / "typescript"
WORKER_BIN = PACKAGE / "bin" / "hookbus-worker.js"
TS_SKILLS = [REPO / "tests" / "typescript" / "skills" / "lifecycle_examples.ts", REPO / "tests" / "typescript" / "skills" / "extras.ts"]
NODE = shutil.which("node")

KEY = "sk-ts-e2e-alice-0123456789"
METERED_KEY = "sk-ts-e2e-bob-0123456789"
API_KEYS = {KEY: {"peer_user_id": "alice", "scopes": []}, METERED_KEY: {"peer_user_id": "bob", "scopes": ["metered"]}}


def require_node() -> str:
    """The `node` binary, or skip: the one reason these tests do not run."""
    if NODE is None:
        pytest.skip("node is not installed: the TypeScript worker needs Node.js >= 20 on PATH")
    return NODE


def require_built_package() -> None:
    """Fail (not skip) when the package was not installed and built: `make ts-deps` does it."""
    missing = [p for p in (PACKAGE / "node_modules" / "ioredis", PACKAGE / "dist" / "worker" / "cli.js") if not p.exists()]
    if missing:
        pytest.fail(f"the TypeScript package is not built ({', '.join(map(str, missing))} missing): run `make ts-deps`")


def ts_worker(
    procs: Processes, group: str, files: list[Path], *, replica: str, claim_idle: float = 1.0, concurrency: int = 8,
    extra: Sequence[str] = (),
) -> Proc:
    """`node hookbus-worker.js --group GROUP FILES...` as one of `procs` (closed with them);
    `extra`: more flags (`--version V`)."""
    node = require_node()
    args = [
        node, str(WORKER_BIN), "--group", group, *map(str, files), "--replica", replica,
        "--claim-idle", str(claim_idle), "--concurrency", str(concurrency), *extra,
    ]
    log_path = procs.log_dir / f"{replica}.log"
    with open(log_path, "wb") as log:
        popen = subprocess.Popen(args, env=dict(procs.env, HOOKBUS_TEST_NAME=replica), cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    proc = Proc(replica, "worker", group, args, popen, log_path)
    procs.procs.append(proc)
    return proc


@dataclass
class Stack:
    procs: Processes
    base_url: str
    journal: Path
    env: dict[str, str]

    def entries(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.journal.read_text().splitlines() if line.strip()]

    def of(self, cid: str) -> list[dict[str, Any]]:
        return [e for e in self.entries() if e["cid"] == cid]

    async def wait_journal(self, predicate: Any, timeout: float = 15.0) -> list[dict[str, Any]]:
        """The journal once `predicate(entries)` holds (finalize runs after the client's answer)."""

        async def ready() -> list[dict[str, Any]] | None:
            entries = self.entries()
            return entries if predicate(entries) else None

        entries = await wait_for(ready, timeout=timeout)
        assert entries is not None, f"journal never matched:\n{self.journal.read_text()}\n{self.procs.logs(lines=40)}"
        return entries


@asynccontextmanager
async def ts_stack(
    redis_url: str, offline_llm_url: str, tmp: Path, *, agent: str, api_keys: dict[str, Any],
    workers: Callable[[Processes], list[Proc]], extra_env: dict[str, str] | None = None,
) -> AsyncIterator[Stack]:
    """`workers(procs)` (TypeScript and Python replicas), an orchestrator running `agent` and
    the gateway, on a prefix of their own, each a real process; ready once every one is.
    `extra_env`: more settings for every process (HOOKBUS_SHARDS, say)."""
    require_node()
    require_built_package()
    journal = tmp / "journal.jsonl"
    journal.touch()
    keys = tmp / "keys.json"
    keys.write_text(json.dumps(api_keys))
    env = dict(os.environ)
    env.update(
        REDIS_URL=redis_url, HOOKBUS_PREFIX=f"ts{uuid.uuid4().hex[:8]}:", OPENAI_BASE_URL=offline_llm_url,
        HOOKBUS_LOG_FORMAT="json", PYTHONUNBUFFERED="1", HOOKBUS_TS_JOURNAL=str(journal),
        **(extra_env or {}),
    )
    procs = Processes(env, tmp / "logs")
    try:
        port = free_port()
        started = workers(procs)
        orchestrator = procs.orchestrator(agent, instance="orch-1")
        gateway = procs.gateway(port=port, api_keys=keys)
        began = time.monotonic()
        await procs.wait_ready(*started, orchestrator)
        base_url = f"http://127.0.0.1:{port}"
        await procs.wait_http(gateway, f"{base_url}/healthz")
        print(f"\nTypeScript e2e stack ready in {time.monotonic() - began:.1f}s")
        yield Stack(procs, base_url, journal, env)
    finally:
        procs.close()


@pytest.fixture(scope="module")
async def stack(redis_url: str, offline_llm_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    def workers(procs: Processes) -> list[Proc]:
        return [
            ts_worker(procs, "ts", TS_SKILLS, replica="ts-1"),
            procs.worker("py", "tests.typescript.py_skills:OrderProbe", replica="py-1"),
        ]

    async with ts_stack(
        redis_url, offline_llm_url, tmp_path_factory.mktemp("ts-e2e"), agent="tests.typescript.py_skills:agent",
        api_keys=API_KEYS, workers=workers,
    ) as running:
        yield running
