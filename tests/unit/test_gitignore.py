"""The key files the docs tell a newcomer to write are ignored by git where the docs write
them: the gateway recipe's at the repository root, the compose stack's in deploy/."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_key_files_the_docs_write_are_ignored_by_git() -> None:
    assert "> api-keys.json\n" in (ROOT / "docs/gateway.md").read_text()  # the gateway recipe
    assert "deploy/api-keys.json " in (ROOT / "deploy/README.md").read_text()  # the compose set-up
    for path in ("api-keys.json", "deploy/api-keys.json"):
        ignored = subprocess.run(["git", "check-ignore", "--quiet", "--no-index", path], cwd=ROOT)
        assert ignored.returncode == 0, f"{path} is not ignored by git"
