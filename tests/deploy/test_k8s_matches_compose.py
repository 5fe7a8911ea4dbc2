"""Every hookbus container Kubernetes runs is the one `make deploy-check` proved under compose:
the same image, command line, settings, probes, user and read-only root, and at least the
drain time. The check exercises deploy/docker-compose.yml on a real engine; no cluster can run
here, so this ties the manifests to what ran."""

from __future__ import annotations

import ast
from typing import Any

import pytest

from tests.deploy.manifests import (
    KUSTOMIZATIONS,
    NON_SETTINGS_ENV,
    compose_argv,
    compose_default,
    compose_environment,
    compose_services,
    container_argv,
    container_env_names,
    dockerfile_single,
    duration_seconds,
    hookbus_containers,
    is_hookbus_image,
    option_value,
    rendered,
    short_name,
)

SERVICES = compose_services()
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def compose_service_for(argv: list[str]) -> str:
    """The compose service that runs the same role (and group, or agent) as a Kubernetes container."""
    if argv[0] == "worker":
        return f"worker-{option_value(argv, '--group')}"
    if argv[0] == "orchestrator":
        return next(
            name for name, service in SERVICES.items()
            if compose_argv(service.get("command") or [""])[0] == "orchestrator"
            and option_value(compose_argv(service["command"]), "--agent") == option_value(argv, "--agent")
        )
    return argv[0]


def containers(directory) -> list[tuple[str, dict[str, Any], dict[str, Any], list[dict[str, Any]]]]:
    docs = rendered(directory)
    return [
        (workload["metadata"]["name"], workload, container, docs)
        for workload, container in hookbus_containers(docs)
        if workload["kind"] == "Deployment"
    ]


CASES = [
    pytest.param(directory, name, workload, container, docs, id=f"{short_name(directory)}:{name}")
    for directory in KUSTOMIZATIONS
    for name, workload, container, docs in containers(directory)
]


def test_every_compose_service_kubernetes_needs_exists():
    for directory in KUSTOMIZATIONS:
        roles = {compose_service_for(container_argv(c)) for _, _, c, _ in containers(directory)}
        assert roles == {"orchestrator", "orchestrator-support", "worker-guard", "worker-telemetry", "gateway"}, short_name(directory)
        assert roles <= set(SERVICES)


@pytest.mark.parametrize(("directory", "name", "workload", "container", "docs"), CASES)
def test_the_command_line_is_the_compose_one(directory, name, workload, container, docs):
    argv = container_argv(container)
    service = SERVICES[compose_service_for(argv)]
    assert argv == compose_argv(service["command"])
    assert is_hookbus_image(container["image"]) and is_hookbus_image(compose_default(service["image"]))


@pytest.mark.parametrize(("directory", "name", "workload", "container", "docs"), CASES)
def test_the_settings_are_the_compose_ones(directory, name, workload, container, docs):
    service = SERVICES[compose_service_for(container_argv(container))]
    compose_env = compose_environment(service)
    kubernetes_env = set(container_env_names(container, docs)) - set(NON_SETTINGS_ENV)
    assert kubernetes_env <= set(compose_env), kubernetes_env - set(compose_env)
    # The ones that decide where and how it runs are set on both sides.
    for required in ("REDIS_URL", "HOOKBUS_PREFIX", "HOOKBUS_LOG_FORMAT", "HOOKBUS_LOG_LEVEL"):
        assert required in kubernetes_env, required
    configmap = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "hookbus-config")
    assert configmap["data"]["HOOKBUS_LOG_FORMAT"] == compose_env["HOOKBUS_LOG_FORMAT"]


def compose_health_url(test: list[str]) -> str:
    """The URL the compose gateway health check opens (`python -c "...urlopen('URL'...)"`)."""
    call = ast.parse(test[-1]).body[-1]
    assert isinstance(call, ast.Expr) and isinstance(call.value, ast.Call)
    url = call.value.args[0]
    assert isinstance(url, ast.Constant)
    return str(url.value)


@pytest.mark.parametrize(("directory", "name", "workload", "container", "docs"), CASES)
def test_the_probes_are_the_compose_health_check(directory, name, workload, container, docs):
    service = SERVICES[compose_service_for(container_argv(container))]
    check = service["healthcheck"]
    proven_timeout = duration_seconds(check["timeout"])
    exec_probes = [container[p]["exec"]["command"] for p in PROBES if "exec" in container.get(p, {})]
    http_probes = [container[p]["httpGet"] for p in PROBES if "httpGet" in container.get(p, {})]
    assert exec_probes or http_probes, name
    for command in exec_probes:
        assert command == check["test"][1:], (name, command)
    for probe in http_probes:
        port = next(p["containerPort"] for p in container["ports"] if p["name"] == probe["port"])
        assert compose_health_url(check["test"]) == f"http://127.0.0.1:{port}{probe['path']}"
    for probe in PROBES:
        if "exec" in container.get(probe, {}):
            assert container[probe]["timeoutSeconds"] >= proven_timeout, (name, probe)


@pytest.mark.parametrize(("directory", "name", "workload", "container", "docs"), CASES)
def test_user_filesystem_and_drain_are_the_compose_ones(directory, name, workload, container, docs):
    service = SERVICES[compose_service_for(container_argv(container))]
    pod = workload["spec"]["template"]["spec"]
    image_user = int(dockerfile_single("USER").split(":")[0])
    assert pod["securityContext"]["runAsUser"] == image_user
    assert container["securityContext"]["readOnlyRootFilesystem"] is service["read_only"] is True
    assert container["securityContext"]["capabilities"]["drop"] == service["cap_drop"] == ["ALL"]
    assert {m["mountPath"] for m in container["volumeMounts"]} >= set(service["tmpfs"])
    assert pod["terminationGracePeriodSeconds"] >= duration_seconds(service["stop_grace_period"])
