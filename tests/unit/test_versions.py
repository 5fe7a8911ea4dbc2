"""Worker versions: how a replica's version is derived, and which version a new request
is pinned to (hookbus.bus.groups.versions, hookbus.services.worker.versioning)."""

from __future__ import annotations

import pytest
import redis.asyncio as aredis

from hookbus.bus.groups.registry import RegistryView
from hookbus.bus.groups.versions import (
    ReplicaInfo,
    Rollout,
    VersionState,
    check_version,
    choose_version,
    version_states,
)
from hookbus.bus.keys import Keys
from hookbus.services.orchestrator.serving import VersionPins
from hookbus.services.worker.host import GroupHost
from hookbus.services.worker.versioning import hooks_fingerprint, replica_version
from hookbus.skills import Context, HookData, Skill, hook


class Guard(Skill):
    name = "guard"

    @hook("on_chunk", 20)
    def check(self, data: HookData, ctx: Context) -> None:
        return None


class GuardReordered(Skill):
    name = "guard"

    @hook("on_chunk", 30)
    def check(self, data: HookData, ctx: Context) -> None:
        return None


class ReleasedGuard(Guard):
    version = "2.1.0"


def fingerprint(skill: Skill) -> str:
    return hooks_fingerprint(GroupHost("g", [skill]).announcement())


def test_a_hook_s_priority_is_part_of_the_version_derived_from_the_hooks(monkeypatch):
    monkeypatch.delenv("HOOKBUS_WORKER_VERSION", raising=False)
    same, moved = fingerprint(Guard()), fingerprint(GuardReordered())
    assert same == fingerprint(Guard()) and same != moved
    assert replica_version(None, [Guard()], same) == f"h-{same}"


def test_the_flag_beats_the_environment_which_beats_the_skills_declared_version(monkeypatch):
    skills = [ReleasedGuard()]
    monkeypatch.delenv("HOOKBUS_WORKER_VERSION", raising=False)
    assert replica_version(None, skills, "abc") == "2.1.0"
    monkeypatch.setenv("HOOKBUS_WORKER_VERSION", "img-7")
    assert replica_version(None, skills, "abc") == "img-7"
    assert replica_version("v9", skills, "abc") == "v9"


def test_a_version_that_cannot_name_a_stream_is_refused():
    # the whole text counts: a trailing newline (a script's `echo`) is refused, not trimmed
    for bad in ("", "v 2", "v2}", "{x}", "-v2", "a" * 65, "v2\n", "v2 "):
        with pytest.raises(ValueError):
            check_version(bad)
    assert check_version("1.2.3+build-7") == "1.2.3+build-7"


def states(**replicas: tuple[str, float, bool]) -> dict:
    return version_states({
        name: ReplicaInfo(version=version, hooks="h", started=started, draining=draining)
        for name, (version, started, draining) in replicas.items()
    })


def test_new_requests_go_to_the_newest_version_that_is_not_draining():
    rolling = states(a=("v1", 1.0, False), b=("v1", 2.0, False), c=("v2", 3.0, False))
    assert list(rolling) == ["v1", "v2"]
    assert choose_version(rolling, None) == "v2"
    rolled_back = states(a=("v1", 1.0, False), c=("v2", 3.0, True))
    assert choose_version(rolled_back, None) == "v1"
    stopping = states(a=("v1", 1.0, True), c=("v2", 3.0, True))
    assert choose_version(stopping, None) == "v2"  # all drain: the newest still serves
    assert choose_version({}, None) is None


def test_a_canary_gets_its_share_of_new_requests_and_the_rest_the_newest_other_version():
    live = states(a=("v1", 1.0, False), c=("v2", 3.0, False))
    canary = Rollout(canary="v2", share=0.25)
    assert choose_version(live, canary, draw=0.2) == "v2"
    assert choose_version(live, canary, draw=0.3) == "v1"
    assert choose_version(live, Rollout(canary="v2", share=0.0), draw=0.0) == "v1"  # a roll back
    assert choose_version(live, Rollout(canary="v3", share=1.0)) == "v2"  # a canary with no replica


def _states(**replicas: tuple[str, bool]) -> dict[str, VersionState]:
    """replica -> (version, draining), as the registry's look at the live replicas shows them."""
    return version_states(
        {name: ReplicaInfo(version=v, hooks="h", draining=d, started=n) for n, (name, (v, d)) in enumerate(replicas.items())}
    )


def test_a_hop_in_flight_is_lost_once_its_version_is_gone_but_not_after_a_drain():
    """hookbus.services.orchestrator.serving.version_pins.VersionPins.lost_hops, called after each
    look at the replicas (no Redis command: the client is never used)."""
    registry = RegistryView(aredis.Redis(), Keys("t:"))
    pins = VersionPins(registry.client, Keys("t:"), registry)
    registry.versions = {"g": _states(a=("v1", False), b=("v2", False))}
    pins.watch("hop-1", "g", "v1")
    pins.watch("hop-2", "g", "v2")
    pins.watch("hop-3", "g", None)
    assert pins.lost_hops() == []
    registry.versions = {"g": _states(b=("v2", False))}  # v1's heartbeat lapsed
    assert [hop for hop, _ in pins.lost_hops()] == ["hop-1"]
    registry.versions = {"g": {}}  # no replica at all: the hops wait (the version may come back)
    assert pins.lost_hops() == []
    registry.versions = {"g": _states(b=("v2", False))}
    pins.unwatch("hop-1")
    assert pins.lost_hops() == []  # no longer waiting: nothing to take back

    registry.versions = {"g": _states(a=("v1", True), b=("v2", False))}  # v1's last replica drains
    pins.watch("hop-4", "g", "v1")
    assert pins.lost_hops() == []
    registry.versions = {"g": _states(b=("v2", False))}  # it left at its drain limit, finishing its hops
    assert pins.lost_hops() == []
