"""`hookbus run` as a newcomer uses it: the curl line it prints works as pasted, the Python
client finds the stack from the same folder, Ctrl-C in the terminal stops everything within
3 s, a second stack in the same folder refuses, and a dead stack's leftovers mislead nobody."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pexpect
import pytest

from hookbus.bus.connection.embedded import free_port

pytestmark = pytest.mark.slow

HOOKBUS = [sys.executable, "-m", "hookbus.services.cli.main"]
ROOT = Path(__file__).resolve().parents[2]


def clean_env() -> dict[str, str]:
    """A user's shell: no REDIS_URL (an embedded Redis), no endpoint (the offline model)."""
    drop = {"REDIS_URL", "OPENAI_BASE_URL", "HOOKBUS_MODEL", "HOOKBUS_PREFIX"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def start_stack(folder: Path) -> tuple[subprocess.Popen[str], list[str]]:
    """`hookbus run --keep` in a process group of its own, as a terminal runs it; returns once
    it says it keeps running, with what it printed so far."""
    process = subprocess.Popen(
        [*HOOKBUS, "run", "--keep", "--port", str(free_port())],
        cwd=folder, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.strip().startswith("curl "):
            return process, lines
    process.kill()
    pytest.fail("hookbus run did not come up:\n" + "".join(lines))


def descendants(pid: int) -> list[int]:
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if fields.get("PPid", "").strip() == str(pid):
            child = int(status.parent.name)
            found += [child, *descendants(child)]
    return found


def test_a_running_stack_serves_its_curl_line_its_client_and_stops_on_ctrl_c_within_3_s(tmp_path):
    process, lines = start_stack(tmp_path)
    children = descendants(process.pid)
    try:
        curl = lines[-1].strip()
        answer = subprocess.run(curl, shell=True, capture_output=True, text=True, timeout=60)
        body = json.loads(answer.stdout)
        assert body["object"] == "chat.completion", answer.stdout
        assert body["choices"][0]["message"]["content"]

        # The Python client with no arguments finds the stack of the folder it runs in.
        code = (
            "import asyncio\nfrom hookbus import HookbusClient\n"
            "async def main():\n"
            "    async with HookbusClient() as client:\n"
            "        print((await client.complete('hi')).choices[0].message.content)\n"
            "asyncio.run(main())\n"
        )
        client = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, env=clean_env(),
            capture_output=True, text=True, timeout=60,
        )
        assert client.returncode == 0 and client.stdout.strip(), client.stderr

        # A second stack in the same folder refuses instead of taking the first one's state.
        second = subprocess.run(
            [*HOOKBUS, "run", "--once", "--port", str(free_port())],
            cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60,
        )
        assert second.returncode == 1, second.stdout + second.stderr
        assert f"pid {process.pid}" in second.stdout and "another folder" in second.stdout
        assert process.poll() is None

        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends
        started = time.monotonic()
        process.wait(timeout=30)
        took = time.monotonic() - started
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert took < 3.0, f"Ctrl-C took {took:.1f} s"
    assert process.returncode == 0
    assert children and not [pid for pid in children if Path(f"/proc/{pid}").exists()]
    assert not (tmp_path / ".hookbus" / "redis-url").exists()


def test_a_dead_stacks_leftovers_are_ignored_not_retried(tmp_path):
    state = tmp_path / ".hookbus"
    state.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (state / "run.pid").write_text(dead.stdout.strip())
    (state / "redis-url").write_text(f"redis://127.0.0.1:{free_port()}/0")

    started = time.monotonic()
    status = subprocess.run(
        [*HOOKBUS, "status"], cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert time.monotonic() - started < 10
    assert status.returncode == 1
    assert "no Redis to talk to" in status.stderr and "Traceback" not in status.stderr

    code = "from hookbus import HookbusClient\ntry:\n    HookbusClient()\nexcept ValueError as e:\n    print(e)\n"
    client = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=clean_env(), capture_output=True, text=True)
    assert "no Redis to talk to" in client.stdout, client.stdout + client.stderr


def test_status_against_an_unreachable_redis_is_one_line_not_a_traceback(tmp_path):
    env = clean_env() | {"REDIS_URL": f"redis://:secret@127.0.0.1:{free_port()}/0"}
    status = subprocess.run([*HOOKBUS, "status"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 1
    assert "cannot reach Redis at redis://:***@127.0.0.1" in status.stderr, status.stderr
    assert "Traceback" not in status.stderr and "secret" not in status.stderr


def test_ctrl_c_in_the_terminal_stops_make_run_within_3_s(tmp_path):
    """`make run` in a terminal, as the README says, then Ctrl-C: the terminal's SIGINT
    reaches make and `hookbus run` (the services are in sessions of their own), and the
    prompt is back within 3 s. Run from another folder with this checkout's Makefile and
    venv, so the stack's state is that folder's."""
    venv = Path(sys.executable).parent.parent
    stamp = venv / ".installed"
    if not stamp.exists() or stamp.stat().st_mtime < (ROOT / "pyproject.toml").stat().st_mtime:
        pytest.skip(f"{venv} is not a venv `make venv` built and up to date: make would install into it")
    (tmp_path / "pyproject.toml").symlink_to(ROOT / "pyproject.toml")  # the venv's prerequisite
    child = pexpect.spawn(
        "make", ["-f", str(ROOT / "Makefile"), f"VENV={venv}", "run"],
        cwd=str(tmp_path), env=clean_env(), encoding="utf-8", timeout=120,
    )
    try:
        child.expect("the stack keeps running")
        child.expect("curl ")
        child.sendintr()  # what Ctrl-C in the terminal does: SIGINT to its foreground group
        started = time.monotonic()
        child.expect("hookbus: stopped", timeout=30)
        child.expect(pexpect.EOF, timeout=30)
        took = time.monotonic() - started
    finally:
        if child.isalive():
            child.close(force=True)
    assert took < 3.0, f"Ctrl-C took {took:.1f} s"
    assert not (tmp_path / ".hookbus" / "redis-url").exists()
