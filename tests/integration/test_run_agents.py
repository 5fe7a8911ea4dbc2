"""The README's first `hookbus run --agent` example, run as written: its `agents.py` in a
fresh folder, the stack serving those agents instead of the demo (the folder importable),
then `hookbus send --agent` and `hookbus status --agent` from the same folder, and the curl
line the stack prints, which names one of the user's agents."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hookbus.bus.connection.embedded import free_port
from tests.doc_blocks import ROOT, marked_block
from tests.integration.test_run_stack_lifecycle import clean_env

pytestmark = pytest.mark.slow

HOOKBUS = [sys.executable, "-m", "hookbus.services.cli.main"]
COMMANDS = re.compile(r"<!-- run-agents-commands -->\n```sh\n(.*?)```", re.S)


def commands() -> list[list[str]]:
    """The README's command lines (comments dropped), `.venv/bin/hookbus` as this interpreter runs it."""
    block = COMMANDS.search((ROOT / "README.md").read_text())
    assert block, "no ```sh block after <!-- run-agents-commands --> in README.md"
    lines = [shlex.split(line, comments=True) for line in block.group(1).splitlines()]
    return [[*HOOKBUS, *words[1:]] if words[0] == ".venv/bin/hookbus" else words for words in lines if words]


def test_the_readmes_run_agent_example_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "agents.py").write_text(marked_block("run-agents").code)
    run, send, status = commands()
    assert run[len(HOOKBUS):len(HOOKBUS) + 1] == ["run"], run
    # not a terminal here: --keep keeps it running as a terminal would
    stack = subprocess.Popen(
        [*run, "--keep", "--port", str(free_port())], cwd=tmp_path, env=clean_env(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    assert stack.stdout is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (lines and lines[-1].strip().startswith("curl ")):
            line = stack.stdout.readline()
            if not line:
                break
            lines.append(line)
        printed = "".join(lines)
        assert lines and lines[-1].strip().startswith("curl "), printed
        assert "serving the agents calc, support" in printed
        assert printed.count("Offline model reply to: Hello! What can you do?") == 2, printed

        sent = subprocess.run(send, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60)
        assert sent.returncode == 0, sent.stdout + sent.stderr
        assert "The tool add returned: 5" in sent.stdout

        shown = subprocess.run(status, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert re.search(r"^calc\s+1\s+0\s+0\s", shown.stdout, re.M), shown.stdout  # one orchestrator, empty queue
        assert not re.search(r"^support\s", shown.stdout, re.M), shown.stdout  # filtered by agent

        curl = subprocess.run(lines[-1].strip(), shell=True, capture_output=True, text=True, timeout=60)
        body = json.loads(curl.stdout)
        assert body["choices"][0]["message"]["content"].startswith("Offline model reply to:"), curl.stdout
    finally:
        os.killpg(stack.pid, signal.SIGINT)
        stack.wait(timeout=60)
