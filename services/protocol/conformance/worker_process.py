"""The worker under test: a process (and its children: `npx` starts node) in a session of its
own, so that the kit can kill all of it at once and start it again."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path


class WorkerProcess:
    def __init__(self, command: Sequence[str], env: Mapping[str, str]) -> None:
        self.command = list(command)
        self.env = dict(env)
        self.log_path = Path(tempfile.mkstemp(prefix="hookbus-conformance-worker-", suffix=".log")[1])
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    @property
    def exited(self) -> int | None:
        """Its exit status once it has ended, else None."""
        return None if self._process is None else self._process.poll()

    def kill(self) -> None:
        """SIGKILL to its whole process group: no drain, no goodbye."""
        self._signal(signal.SIGKILL)
        if self._process is not None:
            self._process.wait(10)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM (a drain), then SIGKILL after `grace` seconds."""
        if self._process is None or self._process.poll() is not None:
            return
        self._signal(signal.SIGTERM)
        try:
            self._process.wait(grace)
        except subprocess.TimeoutExpired:
            self.kill()

    def terminate(self) -> None:
        """SIGTERM to its whole process group, without waiting: the drain starts."""
        self._signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int | None:
        """Its exit status once it ended within `timeout` seconds, else None."""
        if self._process is None:
            return None
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _signal(self, sig: signal.Signals) -> None:
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, sig)
