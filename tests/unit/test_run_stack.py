"""`hookbus run --once` (what `make run` does): the whole stack, one demo request, and one
line telling the user the answers come from the offline stand-in model."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from hookbus.bus.connection.embedded import free_port

pytestmark = pytest.mark.slow


def test_hookbus_run_once_serves_the_demo_and_says_the_model_is_the_offline_stand_in(
    redis_url, prefix, tmp_path
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_BASE_URL"}
    env.update(REDIS_URL=redis_url, HOOKBUS_PREFIX=prefix)
    done = subprocess.run(
        [sys.executable, "-m", "hookbus.services.cli.main", "run", "--once", "--port", str(free_port())],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "The tool add returned: 5" in output
    assert output.count("the built-in offline model") == 1, output
    assert "(not an AI)" in output
    assert re.search(r"console on http://127\.0\.0\.1:\d+/console/", output), output
    assert re.search(r"its waterfall: http://127\.0\.0\.1:\d+/console/#/requests/chatcmpl-\w+", output), output
