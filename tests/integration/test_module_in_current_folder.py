"""A newcomer's own module, named by a `module:attr` spec, in the folder they run `hookbus` in.

The `hookbus` console script's import path starts at its own folder (the venv's `bin`), not
the current one, so `hookbus worker --group g mymodule:Shout` beside `mymodule.py` failed
with `No module named 'mymodule'`. These run the installed console script as a subprocess in
a temporary folder that holds the module (nothing on PYTHONPATH points at it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import redis.asyncio as aredis

from hookbus.bus.keys import Keys
from tests.deploy.manifests import hookbus_executable
from tests.waiting import wait_for

SHOUT = textwrap.dedent(
    '''
    from hookbus import Context, HookData, Skill, hook


    class Shout(Skill):
        name = "shout"

        @hook("on_chunk")
        async def shout(self, data: HookData, ctx: Context) -> None:
            data.content = (data.content or "").upper()
    '''
)

AGENT = textwrap.dedent(
    '''
    from hookbus import Agent

    agent = Agent("newcomer")
    '''
)


def _env(service_env: dict[str, str]) -> dict[str, str]:
    env = dict(service_env)
    env.pop("PYTHONPATH", None)  # the folder must be found as the current one, not by the path
    return env


def _start_worker(folder: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(hookbus_executable()), "worker", "--group", "g", "mymodule:Shout", "--replica", "newcomer-1"],
            cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT,
        )


async def test_a_worker_loads_a_skill_from_the_current_folder(tmp_path: Path, service_env, prefix):
    """Beside the module, a `uvloop.py` (the worker imports uvloop after the spec): the
    folder joins the import path last, so it shadows no installed package."""
    (tmp_path / "mymodule.py").write_text(SHOUT)
    (tmp_path / "uvloop.py").write_text("raise SystemExit('the folder shadowed an installed package')\n")
    log = tmp_path / "worker.log"
    worker = _start_worker(tmp_path, _env(service_env), log)
    client = aredis.Redis.from_url(service_env["REDIS_URL"])
    started = time.time()
    try:

        async def heartbeat() -> bool:
            if worker.poll() is not None:
                return True  # exited: the assert below shows why
            score = await client.zscore(Keys(prefix).replicas("g"), "newcomer-1")
            return score is not None and float(score) >= started

        await wait_for(heartbeat, timeout=60, every=0.2)
        assert worker.poll() is None, log.read_text(errors="replace")
    finally:
        await client.aclose()
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGTERM)
        worker.wait(30)


def test_an_orchestrator_loads_an_agent_from_the_current_folder(tmp_path: Path, service_env):
    """With no endpoint and no offline model asked for, the orchestrator refuses to start,
    which it says only after its agent was loaded: the spec resolved."""
    (tmp_path / "myagent.py").write_text(AGENT)
    env = _env(service_env)
    env.pop("OPENAI_BASE_URL", None)
    env.pop("HOOKBUS_MODEL", None)
    result = subprocess.run(
        [str(hookbus_executable()), "orchestrator", "--agent", "myagent:agent"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0
    assert "no LLM endpoint" in result.stderr, result.stderr
    assert "myagent" not in result.stderr


def test_a_module_found_nowhere_says_where_it_was_looked_for(tmp_path: Path, service_env):
    result = subprocess.run(
        [str(hookbus_executable()), "worker", "--group", "g", "notthere:Shout"],
        cwd=tmp_path, env=_env(service_env), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0
    assert "No module named 'notthere'" in result.stderr
    assert str(tmp_path) in result.stderr and "PYTHONPATH" in result.stderr, result.stderr

