"""`npm test` of the TypeScript package (skills/typescript), as part of the Python suite: its
own tests (decorators, failure rules, batched chunks, claims, dead letters, the worker
command) on this session's Redis. Skipped only when node or npm is missing."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.typescript.conftest import PACKAGE, require_built_package, require_node


def test_npm_test_passes(redis_url: str) -> None:
    require_node()
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: it runs the TypeScript package's tests")
    require_built_package()
    env = dict(os.environ, REDIS_URL=redis_url, HOOKBUS_LOG_LEVEL="error")
    result = subprocess.run([npm, "test"], cwd=PACKAGE, env=env, capture_output=True, text=True, timeout=110)
    summary = "\n".join(line for line in result.stdout.splitlines() if line.startswith(("# ", "not ok")))
    assert result.returncode == 0, f"npm test failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    assert "# fail 0" in summary, summary
