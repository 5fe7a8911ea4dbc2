"""The version of the worker protocol (hops, replies, announcements, heartbeats), and which
versions this build serves.

A worker announces the version it speaks (`GroupAnnouncement.protocol`, and each replica's
`ReplicaHeartbeat.protocol`); missing means "1.0" (`UNSTATED`), what every worker spoke before the field
existed. Versions are "MAJOR.MINOR": a minor revision only adds what readers of the same
major may ignore, a major one changes what a reader must understand. An orchestrator serves
the majors in `SERVED_MAJORS` and refuses a group that speaks another one rather than
misread its replies (hookbus.bus.groups.registry.RegistryView). The revision table is in
hookbus.services.protocol.spec.
"""

from __future__ import annotations

import re

PROTOCOL = "1.1"
"""The version this build's workers speak and its spec describes."""

UNSTATED = "1.0"
"""The version of a worker that states none (from before the field existed)."""

SERVED_MAJORS = frozenset({1})
"""Major versions this build's orchestrators can serve."""

VERSION_PATTERN = r"^[0-9]+\.[0-9]+$"


def refusal(version: str) -> str | None:
    """Why an orchestrator of this build cannot serve a worker that speaks `version`, or
    None when it can."""
    if not re.match(VERSION_PATTERN, version):
        return f"protocol {version!r} is not a MAJOR.MINOR version"
    major = int(version.split(".", 1)[0])
    if major not in SERVED_MAJORS:
        served = ", ".join(f"{m}.x" for m in sorted(SERVED_MAJORS))
        return f"speaks protocol {version}; this orchestrator serves {served}"
    return None


def at_least(version: str, wanted: tuple[int, int]) -> bool:
    """Whether `version` ("MAJOR.MINOR") is the same major as `wanted` and not older."""
    if not re.match(VERSION_PATTERN, version):
        return False
    major, minor = (int(part) for part in version.split(".", 1))
    return major == wanted[0] and minor >= wanted[1]
