"""The version a worker replica runs its group at.

Given by the deployment (`hookbus worker --version V`, or `HOOKBUS_WORKER_VERSION`, e.g.
from the image tag), else derived: the skills' own declared `version`s (`Skill.version`)
when every skill declares one, else a short hash of what the group serves. Either way the
hooks' set and priorities are part of what a version is: they are fingerprinted
(`hooks_fingerprint`) beside the version, and two replicas announcing one version with
different fingerprints is reported as a deployment error (hookbus.bus.groups.registry).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from hookbus.bus.groups.registry import GroupAnnouncement
from hookbus.bus.groups.versions import check_version
from hookbus.bus.settings import get_settings
from hookbus.skills import Skill


def hooks_fingerprint(announcement: GroupAnnouncement) -> str:
    """8 hex digits over the hooks (skill, method, lifecycle, priority, scope, critical),
    and the tools a group serves (on_compaction handlers are hooks too), independent of
    their order."""
    body = json.dumps(
        {
            "hooks": sorted(
                [h.skill, h.method, h.lifecycle, h.priority, h.scope, h.critical] for h in announcement.hooks
            ),
            "tools": sorted([t.skill, t.name] for t in announcement.tools),
        },
        separators=(",", ":"),
    )
    return hashlib.sha256(body.encode()).hexdigest()[:8]


def replica_version(given: str | None, skills: Sequence[Skill], fingerprint: str) -> str:
    """`given` (the flag), else the environment, else the skills' declared versions
    (the version alone for one skill; `name-version` joined by `+` for several), else
    `h-<fingerprint>`."""
    chosen = given or get_settings().worker_version
    if chosen:
        return check_version(chosen)
    declared = [(skill.name, skill.version) for skill in skills]
    if all(version for _, version in declared):
        if len(declared) == 1:
            return check_version(str(declared[0][1]))
        return check_version("+".join(f"{name}-{version}" for name, version in declared))
    return f"h-{fingerprint}"
