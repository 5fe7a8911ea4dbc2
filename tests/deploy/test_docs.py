"""The deploy guides exist and cover what users come for."""

from __future__ import annotations

from tests.deploy.manifests import DEPLOY, K8S


def test_scaling_guide_covers_local_compose_and_kubernetes():
    guide = (DEPLOY / "README.md").read_text()
    for needle in ("hookbus worker", "--scale worker-guard=3", "KEDA", "hookbus status", "lag"):
        assert needle in guide, needle


def test_kubernetes_notes_cover_sentinel_cluster_and_sizing():
    notes = (K8S / "README.md").read_text()
    for needle in (
        "Sentinel",
        "Cluster",
        "{hookbus}:",
        "HOOKBUS_PREFIX",
        "hookbus status",
        "lagCount",
    ):
        assert needle in notes, needle
