"""deploy/docker-compose.yml as the check runs it: its own project name, a generated Redis
password and API keys file, the billing group of the `check` profile, and a free host port.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from pathlib import Path

from pydantic import BaseModel

from hookbus.services.cli.monitor import Status
from tests.deploy.check.commands import CheckFailed, compose_cli, docker_cli, run
from tests.deploy.check.images import HOOKBUS_IMAGE, REDIS_IMAGE, ROOT
from tests.deploy.check.traffic import Api, client

PROJECT = "hookbus-check"
COMPOSE_FILE = ROOT / "deploy" / "docker-compose.yml"
CONTAINER_UID = 10001
HEALTH_TIMEOUT = 180
CHECK_MODEL_URL = "http://model:8080/v1"
"""The LLM endpoint of the checked stack: the `model` service of the compose `check` profile."""


class Caller(BaseModel):
    """One API key of the generated keys file and who it stands for."""

    key: str
    peer_user_id: str
    has_credit: bool


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Stack:
    """One compose project; `down()` removes its containers, network and volume."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.port = free_port()
        self.model = ""  # what GET /v1/models lists, once the stack is up
        self.callers = [
            Caller(key=f"sk-{secrets.token_urlsafe(24)}", peer_user_id="alice", has_credit=True),
            Caller(key=f"sk-{secrets.token_urlsafe(24)}", peer_user_id="bob", has_credit=False),
        ]
        keys = work / "api-keys.json"
        keys.write_text(json.dumps({c.key: {"peer_user_id": c.peer_user_id, "scopes": []} for c in self.callers}))
        # The secret is bind-mounted as it is: readable by the container user, nobody else.
        os.chown(keys, CONTAINER_UID, CONTAINER_UID)
        keys.chmod(0o400)
        self.env_file = work / "env"
        self.env_file.write_text(
            "\n".join([
                f"REDIS_PASSWORD={secrets.token_urlsafe(24)}",
                f"HOOKBUS_API_KEYS_FILE={keys}",
                f"HOOKBUS_GATEWAY_PORT={self.port}",
                f"HOOKBUS_IMAGE={HOOKBUS_IMAGE}",
                f"REDIS_IMAGE={REDIS_IMAGE}",
                # The check profile's `model` service: the offline stand-in, asked for by name.
                f"OPENAI_BASE_URL={CHECK_MODEL_URL}",
                "HOOKBUS_MODEL=offline",
                "HOOKBUS_NO_CREDIT_PEERS=" + ",".join(c.peer_user_id for c in self.callers if not c.has_credit),
            ]) + "\n"
        )
        self.env_file.chmod(0o600)

    def api(self, *, has_credit: bool) -> Api:
        return client(self.base_url, self.caller(has_credit=has_credit).key, self.model)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def caller(self, *, has_credit: bool) -> Caller:
        return next(c for c in self.callers if c.has_credit == has_credit)

    def compose(self, *arguments: str, timeout: float = 600) -> str:
        argv = [*compose_cli(), "--project-name", PROJECT, "--env-file", str(self.env_file),
                "--profile", "check", "-f", str(COMPOSE_FILE), *arguments]
        return run(argv, cwd=COMPOSE_FILE.parent, timeout=timeout).stdout

    def up(self, *scale: str) -> None:
        flags = [flag for service_count in scale for flag in ("--scale", service_count)]
        self.compose("up", "-d", "--no-build", *flags)

    def down(self) -> None:
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "10")

    def containers(self, service: str | None = None, *, running: bool = True) -> list[str]:
        """Container ids of this project (of one service), oldest first."""
        filters = ["--filter", f"label=com.docker.compose.project={PROJECT}"]
        if service:
            filters += ["--filter", f"label=com.docker.compose.service={service}"]
        listing = run([docker_cli(), "ps", *([] if running else ["-a"]), "-q", *filters]).stdout.split()
        return list(reversed(listing))

    def inspect(self, container: str) -> dict:
        return json.loads(run([docker_cli(), "inspect", container]).stdout)[0]

    def wait_healthy(self, timeout: float = HEALTH_TIMEOUT) -> float:
        """Seconds until every running container of the project reports healthy."""
        started = time.monotonic()
        while True:
            states = {c: self.inspect(c)["State"] for c in self.containers()}
            unhealthy = {
                self.name(c): s.get("Health", {}).get("Status", s["Status"])
                for c, s in states.items() if s.get("Health", {}).get("Status") != "healthy"
            }
            if states and not unhealthy:
                return round(time.monotonic() - started, 1)
            if time.monotonic() - started > timeout:
                raise CheckFailed(f"not healthy after {timeout:.0f} s: {unhealthy}")
            time.sleep(2)  # poll interval of this condition wait

    def name(self, container: str) -> str:
        return str(self.inspect(container)["Name"]).lstrip("/")

    def exec(self, service: str, *argv: str) -> str:
        """Run a command in the first running container of a service, as its user."""
        return run([docker_cli(), "exec", self.containers(service)[0], *argv], timeout=120).stdout

    def status(self) -> Status:
        """`hookbus status --json`, run in the gateway container."""
        return Status.model_validate_json(self.exec("gateway", "hookbus", "status", "--json"))

    def logs(self, service: str) -> list[str]:
        """Every log line of a service's containers, including ones that died or restarted."""
        lines: list[str] = []
        for container in self.containers(service, running=False):
            result = run([docker_cli(), "logs", container], timeout=120)
            lines += (result.stdout + result.stderr).splitlines()
        return lines
