"""`hookbus conformance` against the Python worker: the worker's protocol test, and proof that
the kit fails a worker that breaks the rules. The kit runs as the command a user runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = "hookbus.services.protocol.conformance.skills:Probe"


def conformance(
    *options: str, skills: str = PROBE, cli: str = "hookbus.services.cli.main"
) -> subprocess.CompletedProcess[str]:
    worker = [sys.executable, "-m", cli, "worker", "--group", "conformance", "--claim-idle", "2", skills]
    return subprocess.run(
        [sys.executable, "-m", "hookbus.services.cli.main", "conformance", *options, "--", *worker],
        capture_output=True, text=True, timeout=150, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def verdicts(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    lines = [line.split(" ", 1) for line in result.stdout.splitlines() if line.startswith(("PASS ", "FAIL "))]
    return {rest.split(":", 1)[0]: verdict for verdict, rest in lines}


def test_the_python_worker_passes_every_check_but_the_kill() -> None:
    result = conformance("--no-kill")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    found = verdicts(result)
    assert len(found) == 18 and set(found.values()) == {"PASS"}, result.stdout


@pytest.mark.slow
def test_a_hop_held_by_a_killed_python_worker_is_claimed_by_its_restart_and_answered() -> None:
    result = conformance("--check", "claim_after_kill")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert verdicts(result) == {"claim_after_kill": "PASS"}


def test_the_kit_fails_a_worker_that_breaks_the_rules() -> None:
    result = conformance(
        "--check", "none_is_unchanged", "--check", "hook_error", "--check", "session_round_trip",
        skills="tests.conformance.broken_probe:BrokenProbe",
    )
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    assert verdicts(result) == {"none_is_unchanged": "FAIL", "hook_error": "FAIL", "session_round_trip": "PASS"}, result.stdout
    assert "FAIL none_is_unchanged: on_message: returning None changed the data" in result.stdout


def test_the_kit_fails_a_worker_that_disagrees_with_the_spec_constants() -> None:
    """A drain settle of 1.25 s, no reply size limits, a refused version taken: each of the
    three checks of the spec's constants fails it (the TypeScript worker before they were
    shared did the first two)."""
    result = conformance(
        "--check", "reply_size_limits", "--check", "version_strings", "--check", "drain_timing",
        cli="tests.conformance.disagreeing_worker",
    )
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    assert verdicts(result) == {"reply_size_limits": "FAIL", "version_strings": "FAIL", "drain_timing": "FAIL"}, result.stdout
    assert "big_state: the over-limit ctx.state came back" in result.stdout or "big_state: the over-limit change" in result.stdout
    assert "not after the spec's 1.75 s" in result.stdout
