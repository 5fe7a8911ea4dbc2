"""deploy/docker-compose.yml: Redis 7 with AOF, two agents with two orchestrators each, two
scalable worker groups, the gateway on 8000, configured by environment only."""

from __future__ import annotations

import json
import re
from urllib.parse import urlparse

import jsonschema
import pytest

from tests.deploy.check.stack import CHECK_MODEL_URL
from tests.deploy.manifests import (
    COMPOSE_FILE,
    COMPOSE_FILES,
    HARNESS_MOUNT,
    ROOT,
    SCHEMAS,
    compose_argv,
    compose_default,
    compose_environment,
    compose_services,
    duration_seconds,
    hookbus_service_names,
    is_harness_service,
    load_yaml,
    option_value,
    served_agent,
)

WORKER_DRAIN_SECONDS = 30


@pytest.fixture(scope="module")
def services():
    return compose_services()


def long_running(services):
    return {
        name: service
        for name, service in services.items()
        if name in hookbus_service_names() and not service.get("profiles")
    }


def workers(services):
    return {
        name: service
        for name, service in long_running(services).items()
        if compose_argv(service["command"])[0] == "worker"
    }


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda path: path.name)
def test_compose_file_follows_the_compose_specification(path):
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    jsonschema.validate(load_yaml(path), schema, cls=jsonschema.Draft202012Validator)


def test_redis_is_7_with_aof_and_never_evicts(services):
    redis = services["redis"]
    image = compose_default(redis["image"])
    assert image.split(":")[1].startswith("7"), image
    command = compose_argv(redis["command"])
    assert option_value(command, "--appendonly") == "yes"
    assert option_value(command, "--maxmemory-policy") == "noeviction"
    assert redis["healthcheck"]["test"]
    assert any(volume.endswith(":/data") for volume in redis["volumes"])


def test_two_orchestrators_run_the_demo_agent(services):
    orchestrator = services["orchestrator"]
    assert orchestrator["deploy"]["replicas"] >= 2
    argv = compose_argv(orchestrator["command"])
    assert argv[0] == "orchestrator" and option_value(argv, "--agent")


def test_two_agents_each_have_orchestrators_of_their_own(services):
    by_agent = {
        served_agent(argv): service
        for service in long_running(services).values()
        if (argv := compose_argv(service["command"]))[0] == "orchestrator"
    }
    assert set(by_agent) == {"demo", "support"}
    assert all(service["deploy"]["replicas"] >= 2 for service in by_agent.values())


def test_worker_groups_host_the_builtin_skills(services):
    groups = {}
    for service in workers(services).values():
        argv = compose_argv(service["command"])
        groups[option_value(argv, "--group")] = {part for part in argv if ":" in part}
    assert groups["guard"] >= {"hookbus.skills.builtin:SecuritySkill", "hookbus.skills.builtin:ContentFilter"}
    assert groups["telemetry"] >= {
        "hookbus.skills.builtin:RequestLogger",
        "hookbus.skills.builtin:AnalyticsSkill",
        "hookbus.skills.builtin:PerformanceMonitor",
    }


def test_worker_groups_scale_with_compose_scale(services):
    for name, service in workers(services).items():
        # `docker compose up --scale NAME=3` refuses services with a fixed name or host port.
        assert "container_name" not in service, name
        assert "ports" not in service, name
        assert "hostname" not in service, name


def test_the_gateway_listens_on_8000(services):
    gateway = services["gateway"]
    argv = compose_argv(gateway["command"])
    assert argv[0] == "gateway" and option_value(argv, "--port") == "8000"
    published_and_target = [compose_default(str(port)).split(":")[-2:] for port in gateway["ports"]]
    assert ["8000", "8000"] in published_and_target, gateway["ports"]


def test_every_hookbus_service_uses_the_compose_redis(services):
    for name in hookbus_service_names():
        service = services[name]
        redis_url = compose_default(compose_environment(service)["REDIS_URL"] or "")
        assert urlparse(redis_url).hostname == "redis", (name, redis_url)
        assert urlparse(redis_url).password == "REDIS_PASSWORD", (name, redis_url)
        assert service["depends_on"]["redis"]["condition"] == "service_healthy", name


def test_configuration_is_environment_only(services):
    for name in hookbus_service_names():
        service = services[name]
        assert "env_file" not in service, name
        # No config files mounted into hookbus services (the auth override mounts a secret);
        # the check profile's harness is the one mount, read-only, of its own folder.
        if is_harness_service(service):
            assert all(v.endswith(":ro") and HARNESS_MOUNT in v for v in service.get("volumes", [])), name
        else:
            assert "volumes" not in service, name
        assert "configs" not in service, name


def test_long_running_services_have_healthchecks(services):
    for name in ["redis", *long_running(services)]:
        assert services[name].get("healthcheck", {}).get("test"), name


def test_workers_get_time_to_drain_on_stop(services):
    for name, service in long_running(services).items():
        grace = duration_seconds(service["stop_grace_period"])
        assert grace >= WORKER_DRAIN_SECONDS + 10, (name, grace)


def test_redis_requires_the_password_every_hookbus_url_carries(services):
    redis = services["redis"]
    command = compose_argv(redis["command"])
    assert compose_default(option_value(command, "--requirepass") or "") == "REDIS_PASSWORD"
    # redis-cli, the health check, authenticates through REDISCLI_AUTH.
    assert compose_default(redis["environment"]["REDISCLI_AUTH"]) == "REDIS_PASSWORD"
    assert redis["healthcheck"]["test"][1] == "redis-cli"


def test_the_gateway_always_checks_api_keys_from_a_secret(services):
    gateway = services["gateway"]
    keys_path = option_value(compose_argv(gateway["command"]), "--api-keys")
    secret = gateway["secrets"][0]
    assert keys_path == f"/run/secrets/{secret['target']}"
    file = load_yaml(COMPOSE_FILE)["secrets"][secret["source"]]["file"]
    assert compose_default(file) == "./api-keys.json"
    # The keys file stays out of git (and out of the image: see test_dockerfile).
    assert "deploy/api-keys.json" in (ROOT / ".gitignore").read_text().split()


def test_the_check_only_group_needs_its_profile(services):
    """worker-billing (the stand-in 402 of `make deploy-check`) never starts by default."""
    assert services["worker-billing"]["profiles"] == ["check"]


def test_the_check_only_model_needs_its_profile(services):
    """The offline stand-in model (the deploy check's LLM endpoint) never starts by default."""
    assert services["model"]["profiles"] == ["check"]


def test_every_hookbus_service_requires_an_llm_endpoint(services):
    """Unset, compose stops before starting anything, with a message naming the variable."""
    required = re.compile(r"\$\{OPENAI_BASE_URL:\?[^}]*OPENAI_BASE_URL[^}]*\}")
    for name in hookbus_service_names():
        value = compose_environment(services[name])["OPENAI_BASE_URL"] or ""
        assert required.fullmatch(value), (name, value)
        assert compose_environment(services[name]).get("HOOKBUS_MODEL") is None, name


def test_the_deploy_check_points_the_stack_at_its_offline_model_service(services):
    endpoint = urlparse(CHECK_MODEL_URL)
    model = services[endpoint.hostname]
    assert is_harness_service(model)
    served = " ".join(model["entrypoint"])
    assert "offline_model" in served and f"port={endpoint.port}" in served
    assert f"{endpoint.port}/v1/models" in " ".join(model["healthcheck"]["test"])
