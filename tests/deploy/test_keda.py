"""KEDA objects in deploy/k8s: valid against KEDA's CRDs, every worker group scales on its own
consumer group's lag, and each agent's orchestrators on their own queue's."""

from __future__ import annotations

import copy
from functools import cache

import jsonschema
import pytest
import yaml

from tests.deploy.manifests import (
    KUSTOMIZATIONS,
    SCHEMAS,
    by_kind,
    container_argv,
    container_env_names,
    hookbus_containers,
    option_value,
    rendered,
    served_agent,
    short_name,
)

kustomizations = pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=short_name)
REDIS_STREAM_TRIGGERS = {"redis-streams", "redis-sentinel-streams", "redis-cluster-streams"}
ADDRESS_KEYS = {"address", "addressFromEnv", "addresses", "addressesFromEnv"}
HOST_KEYS = {"host", "hostFromEnv", "hosts", "hostsFromEnv"}
PORT_KEYS = {"port", "portFromEnv", "ports", "portsFromEnv"}


def strict(schema):
    """The CRD schema with unknown fields refused (the API server would silently prune them)."""
    schema = copy.deepcopy(schema)

    def visit(node):
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for item in node:
                visit(item)

    visit(schema)
    return schema


@cache
def crd_schemas():
    schemas = {}
    for path in (SCHEMAS / "keda").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version["served"]:
                schema = strict(version["schema"]["openAPIV3Schema"])
                schemas[(f"{group}/{version['name']}", kind)] = schema
    return schemas


def keda_objects(docs):
    return [doc for doc in docs if doc["apiVersion"].startswith("keda.sh/")]


def redis_triggers(scaled_object):
    return [t for t in scaled_object["spec"]["triggers"] if t["type"] in REDIS_STREAM_TRIGGERS]


@kustomizations
def test_keda_objects_validate_against_the_keda_crds(directory):
    objects = keda_objects(rendered(directory))
    assert {doc["kind"] for doc in objects} >= {"ScaledObject", "TriggerAuthentication"}
    for doc in objects:
        schema = crd_schemas()[(doc["apiVersion"], doc["kind"])]
        jsonschema.validate(doc, schema, cls=jsonschema.Draft4Validator)


@kustomizations
def test_every_worker_group_scales_on_its_own_lag(directory):
    docs = rendered(directory)
    prefix = by_kind(docs, "ConfigMap")["hookbus-config"]["data"]["HOOKBUS_PREFIX"]
    scaled_by_target = {
        so["spec"]["scaleTargetRef"]["name"]: so for so in by_kind(docs, "ScaledObject").values()
    }
    groups_seen = set()
    for workload, container in hookbus_containers(docs):
        argv = container_argv(container)
        if argv[0] == "worker":
            group = option_value(argv, "--group")
            # a group of observers works off its observer stream (docs/observers.md)
            streams, consumer_group = {f"{prefix}hooks:{group}", f"{prefix}observe:{group}"}, group
        elif argv[0] == "orchestrator":
            agent = served_agent(argv)
            group, streams, consumer_group = f"orchestrators:{agent}", {f"{prefix}requests:{agent}"}, "orchestrators"
        else:
            continue
        groups_seen.add(group)
        scaled = scaled_by_target.get(workload["metadata"]["name"])
        assert scaled, f"no ScaledObject for {workload['metadata']['name']}"
        triggers = redis_triggers(scaled)
        assert triggers, scaled["metadata"]["name"]
        for trigger in triggers:
            assert trigger["metadata"]["stream"] in streams
            assert trigger["metadata"]["consumerGroup"] == consumer_group
        lag = [t for t in triggers if "lagCount" in t["metadata"]]
        assert lag, f"{scaled['metadata']['name']}: no lagCount trigger"
        assert int(lag[0]["metadata"]["lagCount"]) > 0
        assert int(lag[0]["metadata"]["activationLagCount"]) >= 0
    assert groups_seen >= {"guard", "telemetry", "orchestrators:demo", "orchestrators:support"}


@kustomizations
def test_scalers_find_redis(directory):
    docs = rendered(directory)
    deployments = by_kind(docs, "Deployment")
    authentications = by_kind(docs, "TriggerAuthentication")
    for scaled in by_kind(docs, "ScaledObject").values():
        target = deployments[scaled["spec"]["scaleTargetRef"]["name"]]
        container = target["spec"]["template"]["spec"]["containers"][0]
        for trigger in redis_triggers(scaled):
            metadata = trigger["metadata"]
            keys = set(metadata)
            has_address = bool(ADDRESS_KEYS & keys)
            has_host_and_port = bool(HOST_KEYS & keys and PORT_KEYS & keys)
            assert has_address or has_host_and_port, trigger
            if "addressFromEnv" in metadata:
                # KEDA reads it from the target's first container, env or envFrom.
                assert metadata["addressFromEnv"] in container_env_names(container, docs)
            if "authenticationRef" in trigger:
                assert trigger["authenticationRef"]["name"] in authentications


@kustomizations
def test_shipped_triggers_are_redis_streams(directory):
    for scaled in by_kind(rendered(directory), "ScaledObject").values():
        assert {t["type"] for t in scaled["spec"]["triggers"]} == {"redis-streams"}


@kustomizations
def test_autoscaling_never_goes_below_one_replica(directory):
    # The orchestrator only routes to groups with a live heartbeat: scale-to-zero would skip hooks.
    for scaled in by_kind(rendered(directory), "ScaledObject").values():
        spec = scaled["spec"]
        assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"], scaled["metadata"]["name"]
