"""The merged order of hooks and the catalogue of tools an agent runs with.

In-process hooks and the hooks that worker groups announce are merged into one order
per lifecycle: lowest priority first; ties go to in-process hooks (in skill and
definition order), then to groups in the order they first registered, then to the
order a group announced them. Consecutive hooks of one group form a segment, which
travels as one hop.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from hookbus.skills import LIFECYCLES
from hookbus.skills.skill import BoundHook, BoundTool


@dataclass(frozen=True, slots=True)
class RemoteHook:
    """A hook a worker group announced; enough to order it and address its hop."""

    group: str
    skill: str
    method: str
    lifecycle: str
    priority: int
    scope: str = "all"
    timeout: float | None = None
    critical: bool = False
    group_rank: int = 0
    index: int = 0

    @property
    def key(self) -> str:
        return f"{self.skill}.{self.method}"


@dataclass(frozen=True, slots=True)
class RemoteTool:
    """A tool served by a worker group."""

    group: str
    name: str
    schema: dict[str, Any]
    scope: str = "all"
    timeout: float | None = None


@dataclass(frozen=True, slots=True)
class PlannedHook:
    key: str
    priority: int
    scope: str
    timeout: float | None
    critical: bool
    group: str | None
    local: BoundHook | None
    remote: RemoteHook | None


@dataclass(frozen=True, slots=True)
class Segment:
    """Consecutive hooks that run in one place: in-process (group None) or one hop."""

    group: str | None
    hooks: tuple[PlannedHook, ...]

    def local_hooks(self) -> list[BoundHook]:
        return [h.local for h in self.hooks if h.local is not None]


@dataclass(frozen=True, slots=True)
class PlannedTool:
    name: str
    schema: dict[str, Any]
    scope: str
    group: str | None
    local: BoundTool | None
    timeout: float | None


@dataclass
class HookPlan:
    """Ordered hooks per lifecycle and the tool catalogue; segment lists are cached per scope set."""

    by_lifecycle: dict[str, tuple[PlannedHook, ...]]
    tools: dict[str, PlannedTool]
    _segments: dict[tuple[str, tuple[str, ...]], tuple[Segment, ...]] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        local_hooks: Sequence[BoundHook],
        local_tools: Sequence[BoundTool],
        remote_hooks: Iterable[RemoteHook] = (),
        remote_tools: Iterable[RemoteTool] = (),
    ) -> HookPlan:
        ranked: list[tuple[tuple[int, int, int, int], str, PlannedHook]] = []
        for index, bound in enumerate(local_hooks):
            spec = bound.spec
            planned = PlannedHook(
                bound.key, spec.priority, spec.scope, spec.timeout, spec.critical, None, bound, None
            )
            ranked.append(((spec.priority, 0, 0, index), spec.lifecycle, planned))
        for remote in remote_hooks:
            planned = PlannedHook(
                remote.key, remote.priority, remote.scope, remote.timeout, remote.critical,
                remote.group, None, remote,
            )
            rank = (remote.priority, 1, remote.group_rank, remote.index)
            ranked.append((rank, remote.lifecycle, planned))
        ranked.sort(key=lambda item: item[0])
        by_lifecycle = {
            name: tuple(p for _, lc, p in ranked if lc == name) for name in LIFECYCLES
        }
        tools: dict[str, PlannedTool] = {}
        for remote_tool in remote_tools:
            tools[remote_tool.name] = PlannedTool(
                remote_tool.name, remote_tool.schema, remote_tool.scope, remote_tool.group,
                None, remote_tool.timeout,
            )
        for bound_tool in local_tools:  # in-process tools win a name clash
            tool_spec = bound_tool.spec
            tools[tool_spec.name] = PlannedTool(
                tool_spec.name, tool_spec.openai_schema(), tool_spec.scope, None, bound_tool,
                tool_spec.timeout,
            )
        return cls(by_lifecycle, tools)

    def segments(self, lifecycle: str, scopes: Sequence[str]) -> tuple[Segment, ...]:
        key = (lifecycle, tuple(scopes))
        cached = self._segments.get(key)
        if cached is None:
            allowed = set(scopes)
            hooks = [
                h for h in self.by_lifecycle[lifecycle] if h.scope == "all" or h.scope in allowed
            ]
            cached = tuple(
                Segment(group, tuple(members))
                for group, members in groupby(hooks, key=lambda h: h.group)
            )
            self._segments[key] = cached
        return cached

    def tool_schemas(self, scopes: Sequence[str]) -> list[dict[str, Any]]:
        allowed = set(scopes)
        return [
            t.schema for t in self.tools.values() if t.scope == "all" or t.scope in allowed
        ]
