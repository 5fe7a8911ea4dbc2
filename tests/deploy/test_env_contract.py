"""Every environment variable deploy/ sets is a `hookbus.bus.settings.Settings` field (or a documented
exception), and no hookbus process is ever left without REDIS_URL (it would start an embedded
Redis of its own and silently leave the shared bus)."""

from __future__ import annotations

import pytest

from hookbus.bus.settings import Settings
from tests.deploy.manifests import (
    COMPOSE_FILE,
    HARNESS_MOUNT,
    KUSTOMIZATIONS,
    NON_SETTINGS_ENV,
    compose_environment,
    compose_services,
    container_env_names,
    dockerfile_env,
    hookbus_containers,
    hookbus_service_names,
    is_harness_service,
    rendered,
    short_name,
)


def settings_variables() -> set[str]:
    names = set()
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias if isinstance(field.validation_alias, str) else field.alias
        names.add(alias or name.upper())
    return names


def unknown(variables) -> set[str]:
    return set(variables) - settings_variables() - set(NON_SETTINGS_ENV)


def test_the_settings_model_has_the_documented_variables():
    assert settings_variables() >= {
        "REDIS_URL",
        "HOOKBUS_PREFIX",
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "HOOKBUS_MODEL",
        "HOOKBUS_LOG_FORMAT",
        "HOOKBUS_LOG_LEVEL",
    }


def test_exceptions_are_not_settings():
    # An exception that became a setting belongs in Settings only.
    assert not set(NON_SETTINGS_ENV) & settings_variables()


def test_image_environment_is_settings_only():
    assert not unknown(dockerfile_env()), unknown(dockerfile_env())


def test_compose_environment_is_settings_only():
    services = compose_services(COMPOSE_FILE)
    for name in hookbus_service_names():
        variables = compose_environment(services[name])
        if is_harness_service(services[name]) and "volumes" in services[name]:
            assert variables.pop("PYTHONPATH") == HARNESS_MOUNT, name
        assert not unknown(variables), (name, unknown(variables))
        assert variables.get("REDIS_URL"), name


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=short_name)
def test_kubernetes_environment_is_settings_only(directory):
    docs = rendered(directory)
    containers = list(hookbus_containers(docs))
    assert containers
    for workload, container in containers:
        variables = container_env_names(container, docs)
        where = f"{workload['metadata']['name']}/{container['name']}"
        assert not unknown(variables), (where, unknown(variables))
        assert "REDIS_URL" in variables, where
