"""The conformance kit's checks of the spec's constants against the TypeScript worker,
started as a user starts it (`npx hookbus-worker`): the reply size limits, the version
rule and the drain's settle time, which the worker now reads from the spec (before, it
sent a reply of any size and left a drain after 1.25 s). `make conformance` runs the
whole kit against it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conformance.test_python_worker import verdicts
from tests.typescript.conftest import PACKAGE, REPO, require_built_package, require_node


def test_the_typescript_worker_keeps_the_spec_constants() -> None:
    require_node()
    npx = shutil.which("npx")
    if npx is None:
        pytest.skip("npx is not installed: it starts the TypeScript worker")
    require_built_package()
    worker = [npx, "--prefix", str(PACKAGE), "hookbus-worker", "--group", "conformance", "--claim-idle", "2",
              str(PACKAGE / "conformance" / "probe.ts")]
    result = subprocess.run(
        [sys.executable, "-m", "hookbus.services.cli.main", "conformance",
         "--check", "reply_size_limits", "--check", "version_strings", "--check", "drain_timing", "--", *worker],
        capture_output=True, text=True, timeout=110, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert verdicts(result) == {"reply_size_limits": "PASS", "version_strings": "PASS", "drain_timing": "PASS"}, result.stdout
