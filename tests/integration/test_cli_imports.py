"""A `hookbus` command imports only what it uses: the light commands an operator (or a
probe, or a script during a rollout) runs often never load the agent, the openai client,
FastStream, the gateway or the worker. Checked by the modules a real run of each command
left loaded (a CPU-time threshold would be at the mercy of a busy machine; this is not).
docs/performance.md has the CPU times measured before and after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = (
    "openai", "faststream", "starlette", "uvicorn", "aiohttp", "httpx", "prometheus_client", "uvloop",
    "hookbus.skills.data", "hookbus.services.orchestrator", "hookbus.services.worker",
    "hookbus.services.gateway.app", "hookbus.services.console.app", "hookbus.services.protocol",
)
"""Modules (and their submodules) none of the commands below needs."""

RUN_AND_LIST = """
import json, sys
from hookbus.services.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = tuple(json.loads(HEAVY))
print("\\nLOADED " + json.dumps(sorted(m for m in sys.modules if m.startswith(heavy) and m.partition(".")[0] in
      {h.partition(".")[0] for h in heavy} and any(m == h or m.startswith(h + ".") for h in heavy))))
"""


@pytest.mark.parametrize("command", [
    ["--help"], ["status"], ["status", "--json"], ["rollout", "--group", "g", "--end"], ["health"],
])
def test_a_light_command_imports_none_of_the_heavy_modules(
    command: list[str], redis_url: str, prefix: str, tmp_path: Path
) -> None:
    env = dict(os.environ, REDIS_URL=redis_url, HOOKBUS_PREFIX=prefix)
    code = RUN_AND_LIST.replace("HEAVY", repr(json.dumps(HEAVY)))
    ran = subprocess.run(
        [sys.executable, "-c", code, *command], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    last = ran.stdout.strip().splitlines()[-1]
    assert last.startswith("LOADED "), (ran.stdout, ran.stderr)
    assert json.loads(last.removeprefix("LOADED ")) == [], f"`hookbus {' '.join(command)}` imported heavy modules"
    assert "Traceback" not in ran.stderr, ran.stderr
