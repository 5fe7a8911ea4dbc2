"""`hookbus run` with a model that fails: the demo request failing does not stop the stack,
and it is said in one line; the curl line it then prints asks for the configured model."""

from __future__ import annotations

import os
import signal
import sys

import pexpect
import pytest

from tests.compat import upstream as up
from tests.compat.upstream import RecordingUpstream

pytestmark = pytest.mark.slow


def test_hookbus_run_keeps_the_stack_up_when_the_demo_request_fails(tmp_path):
    with RecordingUpstream() as server:
        server.answer(*[up.error(503, "model is loading", "overloaded")] * 5)
        env = {**os.environ, "OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "k", "HOOKBUS_MODEL": "slow-model"}
        env.pop("REDIS_URL", None)
        child = pexpect.spawn(
            sys.executable, ["-m", "hookbus.services.cli.main", "run", "--keep", "--port", "0", "--replicas", "1"],
            cwd=str(tmp_path), env=env, encoding="utf-8", timeout=120,
        )
        try:
            child.expect(r"hookbus: the demo request failed \(503 overloaded: model is loading\); the services are up")
            child.expect("the stack keeps running")
            # The curl line it prints asks for the model the stack serves, as JSON.
            child.expect(r"curl -s localhost:\d+/v1/chat/completions -H 'Content-Type: application/json' "
                         r"""-d '\{"model": "slow-model", "messages": """)
            child.kill(signal.SIGINT)
            child.expect("hookbus: stopped")
            child.expect(pexpect.EOF)
            child.close()
        finally:
            if child.isalive():
                child.close(force=True)
    assert (child.exitstatus, child.signalstatus) == (0, None)
