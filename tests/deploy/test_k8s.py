"""deploy/k8s: kustomize base and overlays render offline to valid Kubernetes objects with the
probes, resources, disruption budgets and grace periods hookbus needs."""

from __future__ import annotations

import kubernetes_validate
import pytest
from kubernetes_validate.utils import latest_version

from tests.deploy.manifests import (
    K8S,
    K8S_BASE,
    K8S_OVERLAYS,
    KUSTOMIZATIONS,
    by_kind,
    container_argv,
    hookbus_containers,
    kustomize_command,
    load_yaml,
    option_value,
    pod_spec,
    rendered,
    rendered_by_kustomize,
    short_name,
    workload_spec,
)

# The oldest Kubernetes we promise (PDB policy/v1, autoscaling/v2 for KEDA) and the newest known.
KUBERNETES_VERSIONS = ["1.29.0", latest_version()]
KEDA_KINDS = {"ScaledObject", "TriggerAuthentication"}
WORKER_DRAIN_SECONDS = 30

kustomizations = pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=short_name)
overlays = pytest.mark.parametrize("directory", K8S_OVERLAYS, ids=short_name)


def identity(doc):
    return doc["kind"], doc["metadata"]["name"]


def role_of(container):
    return container_argv(container)[0]


@pytest.fixture(scope="module", params=KUSTOMIZATIONS, ids=short_name)
def docs(request):
    return rendered(request.param)


def test_there_are_dev_and_prod_overlays():
    assert {path.name for path in K8S_OVERLAYS} >= {"dev", "prod"}


@kustomizations
def test_kustomization_renders_without_duplicates(directory):
    docs = rendered(directory)
    identities = [identity(doc) for doc in docs]
    assert len(identities) == len(set(identities))


@pytest.mark.skipif(kustomize_command() is None, reason="neither kustomize nor kubectl installed")
@kustomizations
def test_offline_rendering_matches_kustomize(directory):
    def normalized(docs):
        return sorted(docs, key=lambda doc: (doc["kind"], doc["metadata"]["name"]))

    assert normalized(rendered(directory)) == normalized(rendered_by_kustomize(directory))


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schema(docs, version):
    checked = 0
    for doc in docs:
        if doc["kind"] in KEDA_KINDS:
            continue  # custom resources: checked against KEDA's CRDs in test_keda.py
        kubernetes_validate.validate(doc, version, strict=True)
        checked += 1
    assert checked


@kustomizations
def test_every_role_has_a_deployment(directory):
    docs = rendered(directory)
    roles = {}
    for workload, container in hookbus_containers(docs):
        argv = container_argv(container)
        key = argv[0] if argv[0] != "worker" else f"worker:{option_value(argv, '--group')}"
        roles[key] = workload
    assert set(roles) >= {"orchestrator", "gateway", "worker:guard", "worker:telemetry"}
    assert all(workload["kind"] == "Deployment" for workload in roles.values())


@kustomizations
def test_the_gateway_service_reaches_port_8000(directory):
    docs = rendered(directory)
    [(gateway, container)] = [
        (workload, container)
        for workload, container in hookbus_containers(docs)
        if role_of(container) == "gateway"
    ]
    assert option_value(container_argv(container), "--port") == "8000"
    service = by_kind(docs, "Service")[gateway["metadata"]["name"]]
    labels = gateway["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    named_ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    for port in service["spec"]["ports"]:
        target = port.get("targetPort", port["port"])
        assert named_ports.get(target, target) == 8000


@kustomizations
def test_every_container_has_probes_and_resources(directory):
    for doc in rendered(directory):
        spec = pod_spec(doc)
        if spec is None:
            continue
        for container in spec["containers"]:
            where = f"{doc['metadata']['name']}/{container['name']}"
            assert "readinessProbe" in container, where
            assert "livenessProbe" in container, where
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][bound]), (where, bound)


@kustomizations
def test_hookbus_pods_run_locked_down(directory):
    for workload, container in hookbus_containers(rendered(directory)):
        spec = workload_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert spec.get("automountServiceAccountToken") is False


@kustomizations
def test_every_deployment_has_a_disruption_budget(directory):
    docs = rendered(directory)
    budgets = by_kind(docs, "PodDisruptionBudget").values()
    for workload, _ in hookbus_containers(docs):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        matching = [
            b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        assert len(matching) == 1, workload["metadata"]["name"]
        assert matching[0]["spec"].get("maxUnavailable") or matching[0]["spec"].get("minAvailable")


@kustomizations
def test_grace_period_covers_the_worker_drain(directory):
    for workload, container in hookbus_containers(rendered(directory)):
        grace = workload_spec(workload).get("terminationGracePeriodSeconds", 30)
        if role_of(container) == "worker":
            assert WORKER_DRAIN_SECONDS + 10 <= grace <= WORKER_DRAIN_SECONDS + 60, grace
        else:
            assert grace >= WORKER_DRAIN_SECONDS, (workload["metadata"]["name"], grace)


@kustomizations
def test_replicas_of_autoscaled_deployments_belong_to_keda(directory):
    docs = rendered(directory)
    deployments = by_kind(docs, "Deployment")
    for scaled in by_kind(docs, "ScaledObject").values():
        target = deployments[scaled["spec"]["scaleTargetRef"]["name"]]
        # `kubectl apply` would otherwise reset the replica count KEDA chose.
        assert "replicas" not in target["spec"], target["metadata"]["name"]


@kustomizations
def test_secrets_stay_out_of_the_configmap(directory):
    for configmap in by_kind(rendered(directory), "ConfigMap").values():
        assert not {"REDIS_URL", "OPENAI_API_KEY", "REDIS_PASSWORD"} & set(
            configmap.get("data", {})
        )


def secret_keys_used(docs):
    """(secret name, key) pairs the rendered objects read."""
    used = set()
    for doc in docs:
        spec = pod_spec(doc)
        if spec is not None:
            for container in spec["containers"]:
                for variable in container.get("env", []):
                    ref = variable.get("valueFrom", {}).get("secretKeyRef")
                    if ref and not ref.get("optional"):
                        used.add((ref["name"], ref["key"]))
            for volume in spec.get("volumes", []):
                if "secret" in volume:
                    for item in volume["secret"].get("items", []):
                        used.add((volume["secret"]["secretName"], item["key"]))
        if doc["kind"] == "TriggerAuthentication":
            for ref in doc["spec"].get("secretTargetRef", []):
                used.add((ref["name"], ref["key"]))
    return used


@kustomizations
def test_every_secret_key_read_is_provided_or_documented(directory):
    docs = rendered(directory)
    secrets = by_kind(docs, "Secret")
    instructions = (directory / "kustomization.yaml").read_text()
    for name, key in secret_keys_used(docs):
        if name in secrets:
            assert key in {
                **secrets[name].get("data", {}),
                **secrets[name].get("stringData", {}),
            }, key
        else:
            # Created out of band: the overlay's own instructions must say how.
            assert f"create secret generic {name}" in instructions, name
            assert key in instructions, (name, key)


def test_prod_never_applies_the_template_secret():
    assert "Secret" not in {doc["kind"] for doc in rendered(K8S / "overlays" / "prod")}


def test_overlays_pin_the_image():
    for directory in K8S_OVERLAYS:
        for _, container in hookbus_containers(rendered(directory)):
            assert not container["image"].endswith(":latest"), container["image"]
    images = load_yaml(K8S / "overlays" / "prod" / "kustomization.yaml")["images"]
    assert all(image.get("newTag") or image.get("digest") for image in images)


def test_the_dev_overlay_brings_a_durable_redis_7():
    docs = rendered(K8S / "overlays" / "dev")
    redis = by_kind(docs, "StatefulSet")["redis"]
    [container] = workload_spec(redis)["containers"]
    assert container["image"].split(":")[1].startswith("7")
    assert option_value(container["args"], "--appendonly") == "yes"
    assert option_value(container["args"], "--maxmemory-policy") == "noeviction"
    assert "redis" in by_kind(docs, "Service")


def test_base_is_listed_in_full():
    """Every manifest in base/ is a resource of the kustomization (nothing forgotten)."""
    listed = set(load_yaml(K8S_BASE / "kustomization.yaml")["resources"])
    present = {path.name for path in K8S_BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


@overlays
def test_every_api_keys_secret_is_one_the_gateway_accepts(directory):
    """The gateway refuses placeholder and short keys at start: a shipped overlay whose
    keys it would refuse leaves the gateway crash-looping."""
    from hookbus.services.gateway.auth import parse_api_keys

    secrets = [d for d in rendered(directory) if d["kind"] == "Secret" and "api-keys.json" in d.get("stringData", {})]
    for secret in secrets:
        assert parse_api_keys(secret["stringData"]["api-keys.json"], short_name(directory))


@overlays
def test_the_orchestrator_gets_an_llm_endpoint_or_asks_for_the_offline_model_by_name(directory):
    """The orchestrator refuses to start with neither (hookbus.services.orchestrator.llm.client.require_endpoint)."""
    config = by_kind(rendered(directory), "ConfigMap")["hookbus-config"]["data"]
    assert config.get("OPENAI_BASE_URL") or config.get("HOOKBUS_MODEL") == "offline", config


def test_the_base_presents_no_model_as_the_default():
    config = by_kind(rendered(K8S_BASE), "ConfigMap")["hookbus-config"]["data"]
    assert not {"OPENAI_BASE_URL", "HOOKBUS_MODEL"} & set(config), config


def test_production_names_a_real_endpoint_and_model():
    prod = next(path for path in K8S_OVERLAYS if path.name == "prod")
    config = by_kind(rendered(prod), "ConfigMap")["hookbus-config"]["data"]
    assert config["OPENAI_BASE_URL"].startswith("https://")
    assert config["HOOKBUS_MODEL"] not in ("", "offline")
