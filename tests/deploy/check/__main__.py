"""`python -m tests.deploy.check` (`make deploy-check`): build, run, break and tear down the
compose stack on a real Docker engine; print the summary table; exit 1 on any failure."""

from __future__ import annotations

import contextlib
import fcntl
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.deploy.check import images, scenarios
from tests.deploy.check.commands import docker_cli, run
from tests.deploy.check.engine import docker_engine, install_packages
from tests.deploy.check.report import Report
from tests.deploy.check.stack import Stack

LOGS = Path("/var/tmp/hookbus-deploy-check-logs")
LOCK = Path("/var/tmp/hookbus-deploy-check.lock")
LOCK_WAIT = 1800.0


def built(result: images.Built) -> str:
    if result.reused:
        return f"{result.image} already there (delete it to rebuild), {result.size_mb} MB"
    return f"{result.image}: {result.size_mb} MB, built in {result.seconds} s"


def runtime_facts() -> str:
    facts = images.inspect_runtime(images.HOOKBUS_IMAGE)
    scenarios.expect(facts.user.split(":")[0] not in ("", "root", "0"), f"runs as {facts.user}")
    scenarios.expect(not facts.compilers_and_pip, f"runtime image has {facts.compilers_and_pip}")
    scenarios.expect(not facts.history_mentions_pip_conf, "the image history holds pip's index settings")
    return f"user {facts.user}, entrypoint {facts.entrypoint}, no compiler or pip, no pip settings in its history"


def engine_left(engine: str) -> str:
    if engine == "started":
        return "stopped the dockerd this check started"
    return "left running (it was running before)"


def keep_logs(stack: Stack) -> None:
    """Every container's log, for a look after a failure (the stack is removed next)."""
    LOGS.mkdir(parents=True, exist_ok=True)
    for container in stack.containers(running=False):
        result = run([docker_cli(), "logs", container], check=False)
        (LOGS / f"{stack.name(container)}.log").write_text(result.stdout + result.stderr)


@contextlib.contextmanager
def one_check_at_a_time() -> Iterator[None]:
    """Two checks on one machine would share the compose project, the image tags and the
    engine (the first to end stops the dockerd it started under the other): a second one
    waits here, for a bounded time, until the first has ended."""
    with LOCK.open("w") as lock:
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    sys.exit(f"another deploy check held {LOCK} for {LOCK_WAIT:.0f} s; giving up")
                print(f"... waiting for another deploy check on this machine ({LOCK})", flush=True)
                time.sleep(15)  # poll interval of this bounded wait for the other check to end
        yield


def main() -> int:
    with one_check_at_a_time():
        return checked()


def checked() -> int:
    report = Report()
    report.step("install packages", lambda: f"installed {install_packages() or 'nothing (all there)'}")
    with docker_engine() as engine, tempfile.TemporaryDirectory(prefix="hookbus-check-") as work:
        report.step("docker engine", lambda: f"{engine}, server {run([docker_cli(), 'version', '--format', '{{.Server.Version}}']).stdout.strip()}")
        report.step("base image (debootstrap)", lambda: built(images.build_base()))
        report.step("hookbus image", lambda: built(images.build_hookbus()))
        report.step("hookbus image, rebuilt (cache)", lambda: built(images.build_hookbus()))
        report.step("redis image (Debian)", lambda: built(images.build_redis()))
        report.step("runtime image", runtime_facts)
        stack = Stack(Path(work))
        try:
            report.step("compose up, all healthy", lambda: scenarios.compose_up(stack))
            report.step("requests via openai client", lambda: scenarios.requests(stack))
            report.step("scale worker-guard to 3", lambda: scenarios.scale_guard(stack))
            report.step("docker kill mid-load", lambda: scenarios.kill_mid_load(stack))
            report.step("docker stop drains", lambda: scenarios.drain_on_stop(stack))
            report.step("restart redis", lambda: scenarios.restart_redis(stack))
            report.step("container logs are JSON", lambda: scenarios.json_logs(stack))
        finally:
            if report.failed:
                keep_logs(stack)
            report.step("tear down", lambda: scenarios.teardown(stack), always=True)
    report.step("engine left as found", lambda: engine_left(engine), always=True)
    print()
    print(report.table())
    if report.failed:
        print(f"\ndeploy check FAILED; container logs in {LOGS}", file=sys.stderr)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
