"""Loading and reading deploy/: the Dockerfile, the compose files and the Kubernetes manifests.

Shared by the deploy tests so that each test reads as the property it checks. Everything here is
offline: no Docker engine, no cluster, no network.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tests.deploy import kustomize_lite

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
COMPOSE_FILES = [COMPOSE_FILE]
K8S = DEPLOY / "k8s"
K8S_BASE = K8S / "base"
K8S_OVERLAYS = sorted(path for path in (K8S / "overlays").iterdir() if path.is_dir())
KUSTOMIZATIONS = [K8S_BASE, *K8S_OVERLAYS]
SCHEMAS = Path(__file__).resolve().parent / "schemas"

WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}

# Environment variables the deploy files set that are not `hookbus.bus.settings.Settings` fields, and why.
NON_SETTINGS_ENV = {
    "REDIS_ADDRESS": "host:port of Redis for KEDA's redis-streams scaler (addressFromEnv); hookbus ignores it",
    "PYTHONDONTWRITEBYTECODE": "Python runtime in the image: no .pyc on a read-only root filesystem",
    "PYTHONUNBUFFERED": "Python runtime in the image: logs leave the process at once",
    "PIP_DISABLE_PIP_VERSION_CHECK": "pip in the image build",
    "PIP_NO_CACHE_DIR": "pip in the image build",
    "PATH": "the image's virtualenv (/opt/hookbus/bin) first on PATH",
    "HOOKBUS_NO_CREDIT_PEERS": "configuration of CreditLimit, the stand-in billing skill of `make deploy-check`",
}


def hookbus_executable() -> Path:
    """The `hookbus` console script of the venv the tests run in."""
    for candidate in (Path(sys.executable).parent / "hookbus", ROOT / ".venv" / "bin" / "hookbus"):
        if candidate.exists():
            return candidate
    found = shutil.which("hookbus")
    assert found, "the hookbus console script is not installed (pip install -e '.[dev]')"
    return Path(found)


# ---- Dockerfile -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, ENV, ...
    value: str  # the rest of the (joined) line
    stage: int  # index of the FROM this instruction belongs to


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    instructions: list[Instruction] = []
    stage = -1
    pending = ""
    for raw_line in path.read_text().splitlines():
        line = raw_line.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if not full:
            continue
        keyword, _, value = full.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        instructions.append(Instruction(keyword, " ".join(value.split()), stage))
    return instructions


def dockerfile_args() -> dict[str, str]:
    """Default values of the global ARGs (those before the first FROM)."""
    defaults = {}
    for instruction in dockerfile_instructions():
        if instruction.stage >= 0:
            break
        if instruction.keyword == "ARG" and "=" in instruction.value:
            name, _, default = instruction.value.partition("=")
            defaults[name] = default
    return defaults


def expand_args(text: str) -> str:
    defaults = dockerfile_args()
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: defaults.get(m[1] or m[2], m[0]), text)


def final_stage() -> list[Instruction]:
    instructions = dockerfile_instructions()
    last = max(i.stage for i in instructions)
    return [i for i in instructions if i.stage == last]


def exec_form(value: str) -> list[str]:
    """ENTRYPOINT/CMD/HEALTHCHECK CMD as an argv list (the shell form runs under /bin/sh -c)."""
    value = value.strip()
    if value.startswith("["):
        argv = json.loads(value)
        assert all(isinstance(part, str) for part in argv)
        return argv
    return ["/bin/sh", "-c", value]


def dockerfile_single(keyword: str) -> str:
    """The effective value of an instruction in the final stage (the last one wins)."""
    values = [i.value for i in final_stage() if i.keyword == keyword]
    assert values, f"the final stage has no {keyword}"
    return values[-1]


def healthcheck_command() -> list[str]:
    value = dockerfile_single("HEALTHCHECK")
    options, separator, command = value.partition(" CMD ")
    if not separator and value.startswith("CMD "):
        command = value[4:]
    assert command, f"HEALTHCHECK without CMD: {value!r}"
    return exec_form(command)


def dockerfile_env() -> dict[str, str]:
    """Variables the final image sets with ENV."""
    env: dict[str, str] = {}
    for instruction in final_stage():
        if instruction.keyword != "ENV":
            continue
        parts = shlex.split(instruction.value)
        if parts and "=" not in parts[0]:  # legacy `ENV NAME value`
            env[parts[0]] = " ".join(parts[1:])
            continue
        for part in parts:
            name, _, value = part.partition("=")
            env[name] = value
    return env


# ---- compose ------------------------------------------------------------------------------------


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def compose_services(path: Path = COMPOSE_FILE) -> dict[str, dict[str, Any]]:
    return load_yaml(path)["services"]


def is_hookbus_service(service: dict[str, Any]) -> bool:
    return "build" in service or "hookbus" in str(service.get("image", ""))


# The `check` profile's billing worker runs a test harness that is not in the image: compose
# mounts it from this folder and puts it on PYTHONPATH (make deploy-check only).
HARNESS_FOLDER = ROOT / "tests" / "deploy" / "check"
HARNESS_MOUNT = "/opt/hookbus-check"


def is_harness_service(service: dict[str, Any]) -> bool:
    return "check" in service.get("profiles", ())


def hookbus_service_names() -> set[str]:
    """Services of the main compose file that run the hookbus image (override files reuse them)."""
    return {name for name, service in compose_services().items() if is_hookbus_service(service)}


def compose_environment(service: dict[str, Any]) -> dict[str, str | None]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        return dict(
            (item.split("=", 1) + [None])[:2] if "=" in item else (item, None)  # type: ignore[misc]
            for item in environment
        )
    return {name: None if value is None else str(value) for name, value in environment.items()}


def compose_default(value: str) -> str:
    """A compose value as it is when the variables are unset: `${X:-d}` -> `d`, and a
    required `${X:?message}` -> `X` (the check and users set those)."""
    value = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)
    return re.sub(r"\$\{(\w+):\?[^}]*\}", r"\1", value)


def compose_argv(command: Any) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]


def duration_seconds(text: str) -> float:
    """A compose duration such as `45s`, `1m30s`."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


# ---- Kubernetes ---------------------------------------------------------------------------------


@cache
def _rendered(directory: Path) -> tuple[dict[str, Any], ...]:
    return tuple(kustomize_lite.build(directory))


def rendered(directory: Path) -> list[dict[str, Any]]:
    """What `kubectl kustomize directory` renders (computed offline by kustomize_lite)."""
    return copy.deepcopy(list(_rendered(directory)))


def kustomize_command() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


def rendered_by_kustomize(directory: Path) -> list[dict[str, Any]]:
    command = kustomize_command()
    assert command is not None
    output = subprocess.run(
        [*command, str(directory)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(output) if doc]


def short_name(directory: Path) -> str:
    return str(directory.relative_to(K8S))


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    if doc["kind"] in WORKLOAD_KINDS:
        return doc["spec"]["template"]["spec"]
    if doc["kind"] == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return None


def workload_spec(doc: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of a workload (one that `hookbus_containers` yielded)."""
    spec = pod_spec(doc)
    assert spec is not None, f"{doc['kind']} has no pod template"
    return spec


def is_hookbus_image(image: str) -> bool:
    name = image.split("@")[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    return name.rsplit("/", 1)[-1] == "hookbus"


def hookbus_containers(docs: list[dict[str, Any]]):
    """(workload, container) for every container that runs the hookbus image."""
    for doc in docs:
        spec = pod_spec(doc)
        if spec is None:
            continue
        for container in spec.get("initContainers", []) + spec["containers"]:
            if is_hookbus_image(container["image"]):
                yield doc, container


def container_argv(container: dict[str, Any]) -> list[str]:
    """What the container runs after the image's ENTRYPOINT `hookbus`."""
    if "command" in container:
        command = container["command"]
        assert Path(command[0]).name == "hookbus", f"{container['name']}: command {command}"
        return command[1:] + container.get("args", [])
    return list(container.get("args", []))


def option_value(argv: list[str], option: str) -> str | None:
    for index, part in enumerate(argv):
        if part == option and index + 1 < len(argv):
            return argv[index + 1]
        if part.startswith(option + "="):
            return part.split("=", 1)[1]
    return None


def served_agent(argv: list[str]) -> str:
    """The name of the agent an orchestrator's command line serves (its queue is
    `{prefix}requests:<name>`), read from the agent itself."""
    from hookbus.services.cli.specs import load_agent

    spec = option_value(argv, "--agent")
    assert spec, argv
    return load_agent(spec).name


def container_env_names(container: dict[str, Any], docs: list[dict[str, Any]]) -> dict[str, str]:
    """Every variable a container gets, mapped to where it comes from."""
    names: dict[str, str] = {}
    configmaps = by_kind(docs, "ConfigMap")
    secrets = by_kind(docs, "Secret")
    for source in container.get("envFrom", []):
        prefix = source.get("prefix", "")
        if "configMapRef" in source:
            name = source["configMapRef"]["name"]
            assert name in configmaps, f"envFrom names a ConfigMap that is not rendered: {name}"
            for key in configmaps[name].get("data", {}):
                names[prefix + key] = f"ConfigMap {name}"
        if "secretRef" in source:
            name = source["secretRef"]["name"]
            secret = secrets.get(name, {})
            for key in {**secret.get("data", {}), **secret.get("stringData", {})}:
                names[prefix + key] = f"Secret {name}"
    for variable in container.get("env", []):
        names[variable["name"]] = "env"
    return names


# ---- every `hookbus` invocation in deploy/ --------------------------------------------------------


def hookbus_invocations() -> list[tuple[str, list[str]]]:
    """(where, argv after `hookbus`) for every hookbus command line deploy/ runs."""
    invocations: list[tuple[str, list[str]]] = []

    entrypoint = exec_form(dockerfile_single("ENTRYPOINT"))
    cmd = exec_form(dockerfile_single("CMD"))
    invocations.append(("Dockerfile ENTRYPOINT+CMD", entrypoint[1:] + cmd))
    health = healthcheck_command()
    if health[0] == "hookbus":
        invocations.append(("Dockerfile HEALTHCHECK", health[1:]))

    hookbus_services = hookbus_service_names()
    for path in COMPOSE_FILES:
        for name, service in compose_services(path).items():
            where = f"{path.name} {name}"
            if "command" in service and name in hookbus_services:
                invocations.append((f"{where} command", compose_argv(service["command"])))
            test = (service.get("healthcheck") or {}).get("test")
            if isinstance(test, list) and len(test) > 1 and test[1] == "hookbus":
                invocations.append((f"{where} healthcheck", test[2:]))

    for directory in KUSTOMIZATIONS:
        for workload, container in hookbus_containers(rendered(directory)):
            where = f"{short_name(directory)} {workload['kind']}/{workload['metadata']['name']}"
            invocations.append((f"{where} args", container_argv(container)))
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                command = container.get(probe, {}).get("exec", {}).get("command")
                if command and command[0] == "hookbus":
                    invocations.append((f"{where} {probe}", command[1:]))
    return invocations


def subcommand_and_flags(argv: list[str]) -> tuple[str | None, list[str]]:
    """`worker --group g x:Y --concurrency 8` -> ("worker", ["--group", "--concurrency"])."""
    subcommand = argv[0] if argv and not argv[0].startswith("-") else None
    flags = [part.split("=", 1)[0] for part in argv if part.startswith("--")]
    return subcommand, flags


def import_specs() -> set[str]:
    """`pkg.mod:attr` arguments (skills, agents) that the deploy files hand to hookbus."""
    specs = set()
    for _, argv in hookbus_invocations():
        for part in argv:
            if re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", part):
                specs.add(part)
    return specs
