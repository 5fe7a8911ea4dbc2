"""The `hookbus` command lines deploy/ runs exist in the CLI.

Collected from the Dockerfile (ENTRYPOINT, CMD, HEALTHCHECK), both compose files (commands and
health checks) and every rendered Kubernetes manifest (args and exec probes). These fail until
the CLI has every subcommand and flag; that is the point: change the CLI or deploy/ together.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict

import pytest

from tests.deploy.manifests import (
    HARNESS_FOLDER,
    ROOT,
    hookbus_executable,
    hookbus_invocations,
    import_specs,
    subcommand_and_flags,
)


def flags_by_subcommand() -> dict[str, dict[str, list[str]]]:
    """subcommand -> flag -> where it is used."""
    used: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for where, argv in hookbus_invocations():
        subcommand, flags = subcommand_and_flags(argv)
        if subcommand is None:
            continue
        used[subcommand].setdefault("", []).append(where)
        for flag in flags:
            used[subcommand][flag].append(where)
    return used


USED = flags_by_subcommand()


def mentions(help_text: str, word: str) -> bool:
    """`word` appears in help_text as a whole option or command name (--group, not --groups)."""
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", help_text) is not None


def hookbus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(hookbus_executable()), *args], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def test_deploy_files_use_the_documented_commands():
    assert set(USED) >= {"orchestrator", "worker", "gateway", "health"}


def test_top_level_help_lists_every_subcommand_deploy_uses():
    result = hookbus("--help")
    assert result.returncode == 0, result.stderr
    missing = [name for name in USED if not mentions(result.stdout, name)]
    assert not missing, f"`hookbus --help` does not list {missing}"


@pytest.mark.parametrize("subcommand", sorted(USED))
def test_subcommand_accepts_the_flags_deploy_uses(subcommand):
    result = hookbus(subcommand, "--help")
    assert result.returncode == 0, (
        f"`hookbus {subcommand} --help` failed (used by {USED[subcommand]['']}): {result.stderr}"
    )
    missing = {
        flag: where
        for flag, where in USED[subcommand].items()
        if flag and not mentions(result.stdout, flag)
    }
    assert not missing, f"`hookbus {subcommand}` lacks {missing}"


@pytest.mark.parametrize("spec", sorted(import_specs()))
def test_import_spec_resolves(spec):
    module, _, attribute = spec.partition(":")
    code = f"import importlib; getattr(importlib.import_module({module!r}), {attribute!r})"
    # The check profile's harness is importable from the folder compose mounts it from.
    env = {**os.environ, "PYTHONPATH": str(HARNESS_FOLDER)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env
    )
    assert result.returncode == 0, f"{spec}: {result.stderr.strip().splitlines()[-1:]}"
