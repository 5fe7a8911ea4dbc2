"""A tiny offline kustomize: just the features deploy/k8s uses.

`build(dir)` renders a kustomization directory the way `kubectl kustomize` does for
`resources` (files and directories), `patches` (strategic-merge patch files, `$patch: delete`),
`images` and `namespace`. Anything else in a kustomization.yaml raises `NotImplementedError`,
so a manifest change that needs more is noticed here instead of silently rendered wrong.
When `kubectl` or `kustomize` is installed the tests also compare this output with theirs.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED_FIELDS = {"apiVersion", "kind", "resources", "namespace", "images", "patches"}

# Lists in built-in Kubernetes objects that strategic merge patches merge by key; every other
# list (and every list in a custom resource) is replaced as a whole, as kustomize does.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
    "topologySpreadConstraints": "topologyKey",
}

CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "StorageClass",
    "PriorityClass",
    "ClusterTriggerAuthentication",
}

BUILTIN_GROUPS = {
    "",
    "apps",
    "batch",
    "policy",
    "autoscaling",
    "networking.k8s.io",
    "rbac.authorization.k8s.io",
}


def load_documents(path: Path) -> list[dict[str, Any]]:
    """Every non-empty YAML document in a file."""
    with path.open() as stream:
        return [doc for doc in yaml.safe_load_all(stream) if doc]


def resource_id(doc: dict[str, Any]) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def build(directory: Path) -> list[dict[str, Any]]:
    """The resources a kustomization directory renders to, in resource order."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(kustomization) - SUPPORTED_FIELDS
    if unsupported:
        raise NotImplementedError(
            f"{directory}: kustomize_lite does not support {sorted(unsupported)}"
        )

    resources: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        target = directory / entry
        loaded = build(target) if target.is_dir() else load_documents(target)
        for doc in loaded:
            if any(resource_id(doc) == resource_id(seen) for seen in resources):
                raise ValueError(f"{directory}: duplicate resource {resource_id(doc)}")
            resources.append(doc)

    for patch_entry in kustomization.get("patches", []):
        if set(patch_entry) != {"path"}:
            raise NotImplementedError(f"{directory}: only `patches: - path:` is supported")
        for patch in load_documents(directory / patch_entry["path"]):
            resources = apply_patch(resources, patch, directory)

    for image in kustomization.get("images", []):
        for doc in resources:
            set_image(doc, image)

    namespace = kustomization.get("namespace")
    if namespace:
        for doc in resources:
            if doc["kind"] not in CLUSTER_SCOPED:
                doc["metadata"]["namespace"] = namespace
    return resources


def apply_patch(
    resources: list[dict[str, Any]], patch: dict[str, Any], directory: Path
) -> list[dict[str, Any]]:
    """Apply one strategic-merge patch document to the resource it names."""
    patch = copy.deepcopy(patch)
    directive = patch.pop("$patch", None)
    target = resource_id(patch)
    matches = [doc for doc in resources if resource_id(doc) == target]
    if len(matches) != 1:
        raise ValueError(f"{directory}: patch target {target} matched {len(matches)} resources")
    if directive == "delete":
        return [doc for doc in resources if resource_id(doc) != target]
    if directive is not None:
        raise NotImplementedError(f"$patch: {directive}")
    builtin = patch["apiVersion"].rpartition("/")[0] in BUILTIN_GROUPS
    merged = strategic_merge(matches[0], patch, builtin)
    return [merged if resource_id(doc) == target else doc for doc in resources]


def strategic_merge(base: Any, patch: Any, builtin: bool, key: str | None = None) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = copy.deepcopy(base)
        for name, value in patch.items():
            if value is None:
                merged.pop(name, None)
            elif name in merged:
                merged[name] = strategic_merge(merged[name], value, builtin, name)
            else:
                merged[name] = copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and builtin:
        merge_key = list_merge_key(key, base + patch)
        if merge_key:
            merged_list = copy.deepcopy(base)
            for item in patch:
                for index, existing in enumerate(merged_list):
                    if existing.get(merge_key) == item.get(merge_key):
                        merged_list[index] = strategic_merge(existing, item, builtin)
                        break
                else:
                    merged_list.append(copy.deepcopy(item))
            return merged_list
    return copy.deepcopy(patch)


def list_merge_key(key: str | None, items: list[Any]) -> str | None:
    if not items or not all(isinstance(item, dict) for item in items):
        return None
    if key == "ports":
        return "containerPort" if all("containerPort" in item for item in items) else "port"
    return MERGE_KEYS.get(key or "")


def set_image(node: Any, image: dict[str, str]) -> None:
    """kustomize's `images:` transformer on every container in `node`."""
    if isinstance(node, dict):
        for name, value in node.items():
            if name in ("containers", "initContainers") and isinstance(value, list):
                for container in value:
                    container["image"] = renamed_image(container["image"], image)
            else:
                set_image(value, image)
    elif isinstance(node, list):
        for item in node:
            set_image(item, image)


def renamed_image(reference: str, image: dict[str, str]) -> str:
    name, digest = reference.split("@", 1) if "@" in reference else (reference, None)
    tag = None
    if ":" in name.rsplit("/", 1)[-1]:
        name, tag = name.rsplit(":", 1)
    if name != image["name"]:
        return reference
    name = image.get("newName", name)
    if "digest" in image:
        return f"{name}@{image['digest']}"
    tag = image.get("newTag", tag)
    if tag:
        return f"{name}:{tag}"
    return f"{name}@{digest}" if digest else name
