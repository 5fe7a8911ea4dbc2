"""Real `hookbus worker` and `hookbus orchestrator` processes for fault tests.

    procs = Processes(service_env, log_dir)
    a = procs.worker("slow", "tests.faults.fault_skills:Slow", replica="slow-a", claim_idle=1)
    o = procs.orchestrator("tests.faults.fault_skills:agent", instance="orch-a", claim_idle=1)
    await procs.wait_ready(a, o)
    a.kill()        # SIGKILL: no cleanup at all, as a crash
    o.pause()       # SIGSTOP: a stalled process; o.resume() is SIGCONT
    procs.close()   # SIGTERM (then SIGKILL) for every process still running

Each process gets the test's environment (`service_env`: REDIS_URL, HOOKBUS_PREFIX, the
offline model's URL), `HOOKBUS_TEST_NAME` = its replica/instance name (fault skills record
it), and writes its log to `log_dir/<name>.log`; `procs.logs()` gathers the tails for an
assertion message. Processes are only ever signalled by their own pid.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from hookbus.bus.connection.cluster import keys_for
from hookbus.bus.connection.retrying import connect
from hookbus.bus.groups.registry import REFRESH_EVERY
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    name: str
    role: str
    group: str | None
    args: list[str]
    popen: subprocess.Popen[bytes]
    log_path: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash: no shutdown hook runs, entries stay pending."""
        if self.alive:
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(10)

    def pause(self) -> None:
        if self.alive:
            os.kill(self.popen.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.alive:
            os.kill(self.popen.pid, signal.SIGCONT)

    def terminate(self, timeout: float = 15.0) -> None:
        if not self.alive:
            return
        os.kill(self.popen.pid, signal.SIGCONT)
        os.kill(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _still_running(proc: Proc) -> None:
    """Raise, with its log, if `proc` exited: nothing it was to do will happen."""
    if not proc.alive:
        raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}\n{proc.log_tail()}")


class Processes:
    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = dict(env)
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO), self.env.get("PYTHONPATH", "")) if p
        )
        self.env.setdefault("HOOKBUS_LOG_LEVEL", "info")
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        shards = self.env.get("HOOKBUS_SHARDS")  # else the layout's default: 1, or a cluster's
        self.keys = keys_for(self.env["REDIS_URL"], self.env["HOOKBUS_PREFIX"], shards=int(shards) if shards else None)
        self.procs: list[Proc] = []
        self._spawned: dict[str, int] = {}

    def _spawn(
        self, role: str, name: str, group: str | None, args: Sequence[str], module: str = "hookbus.services.cli.main",
        env: dict[str, str] | None = None,
    ) -> Proc:
        count = self._spawned.get(name, 0)
        self._spawned[name] = count + 1
        log_path = self.log_dir / (f"{name}.log" if not count else f"{name}.{count}.log")
        env = dict(self.env, HOOKBUS_TEST_NAME=name, **(env or {}))
        full = [sys.executable, "-m", module, *args]
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(full, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        proc = Proc(name, role, group, full, popen, log_path)
        self.procs.append(proc)
        return proc

    def worker(
        self,
        group: str,
        *skills: str,
        replica: str,
        concurrency: int = 8,
        claim_idle: float = 1.0,
        max_deliveries: int = 3,
        version: str | None = None,
    ) -> Proc:
        """`version`: `--version V`, and `HOOKBUS_WORKER_VERSION=V` for the skills to read."""
        args = [
            "worker", "--group", group, *skills, "--concurrency", str(concurrency),
            "--replica", replica, "--claim-idle", str(claim_idle),
            "--max-deliveries", str(max_deliveries),
        ]
        if version is None:
            return self._spawn("worker", replica, group, args)
        args += ["--version", version]
        return self._spawn("worker", replica, group, args, env={"HOOKBUS_WORKER_VERSION": version})

    def worker_module(self, module: str, *, group: str, replica: str) -> Proc:
        """A worker replica that a test module builds itself (`python -m module`)."""
        return self._spawn("worker", replica, group, [], module=module)

    def orchestrator(
        self,
        agent: str,
        *,
        instance: str,
        concurrency: int = 32,
        claim_idle: float = 1.0,
        max_deliveries: int = 5,
        extra: Sequence[str] = (),
    ) -> Proc:
        args = [
            "orchestrator", "--agent", agent, "--instance", instance,
            "--concurrency", str(concurrency), "--claim-idle", str(claim_idle),
            "--max-deliveries", str(max_deliveries), *extra,
        ]
        return self._spawn("orchestrator", instance, None, args)

    def gateway(self, *, port: int, api_keys: Path, name: str = "gateway") -> Proc:
        """`hookbus gateway` on 127.0.0.1:`port` (wait with `wait_http`)."""
        args = ["gateway", "--port", str(port), "--api-keys", str(api_keys)]
        return self._spawn("gateway", name, None, args)

    def offline_model(self, *, port: int, name: str = "offline-model") -> Proc:
        """The offline model on http://127.0.0.1:`port`/v1, in its own process."""
        count = self._spawned.get(name, 0)
        self._spawned[name] = count + 1
        log_path = self.log_dir / f"{name}.log"
        full = [sys.executable, "-m", "tests.integration.offline_model_process", str(port)]
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(full, env=self.env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        proc = Proc(name, "http", None, full, popen, log_path)
        self.procs.append(proc)
        return proc

    async def wait_http(self, proc: Proc, url: str, timeout: float = 30.0) -> None:
        """Until `url` answers at all (any status)."""
        async with httpx.AsyncClient(timeout=2) as http:

            async def answers() -> bool:
                _still_running(proc)
                try:
                    await http.get(url)
                except httpx.TransportError:
                    return False
                return True

            if not await wait_for(answers, timeout=timeout, every=0.1):
                raise TimeoutError(f"{proc.name} not answering {url}\n{proc.log_tail()}")

    def restart(self, proc: Proc) -> Proc:
        """The same command again (same name), as a supervisor would after a crash."""
        proc.kill()
        args = proc.args[3:]
        return self._spawn(proc.role, proc.name, proc.group, args)

    async def wait_ready(self, *procs: Proc, timeout: float = 60.0) -> None:
        """Until each process wrote a heartbeat after it started (it is consuming); 60 s:
        several interpreters importing at once on a loaded 2-core CI machine."""
        client = connect(self.env["REDIS_URL"])  # a cluster client on a cluster
        waiting = list(procs)

        async def all_ready() -> bool:
            still = []
            for proc in waiting:
                _still_running(proc)
                key = self.keys.replicas(proc.group) if proc.role == "worker" else self.keys.orchestrators
                score = await client.zscore(key, proc.name)
                fresh_since = time.time() - (time.monotonic() - proc.started)
                if score is None or float(score) < fresh_since:
                    still.append(proc)
            waiting[:] = still
            return not waiting

        try:
            if not await wait_for(all_ready, timeout=timeout):
                raise TimeoutError(f"not ready in {timeout}s: {[p.name for p in waiting]}\n{self.logs(waiting)}")
            if any(p.role == "worker" for p in procs):
                # The orchestrators' registry views (in their own processes, not observable
                # from here) pick the new replicas up on their next refresh, every 0.5 s.
                await asyncio.sleep(REFRESH_EVERY + 0.1)
        finally:
            await client.aclose()

    def logs(self, procs: Sequence[Proc] | None = None, lines: int = 30) -> str:
        return "\n".join(
            f"----- {p.name} (pid {p.pid}, rc {p.popen.poll()}) -----\n{p.log_tail(lines)}"
            for p in (procs if procs is not None else self.procs)
        )

    def close(self) -> None:
        for proc in self.procs:
            if proc.alive:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                    os.kill(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 15
        for proc in self.procs:
            try:
                proc.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
