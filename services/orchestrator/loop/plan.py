"""The merged order of hooks and the catalogue of tools an agent runs with.

In-process hooks and the hooks that worker groups announce are merged into one order
per lifecycle: lowest priority first; ties go to in-process hooks (in skill and
definition order), then to groups in the order they first registered, then to the
order a group announced them. Consecutive hooks of one group form a segment, which
travels as one hop.

Observers (`observe=True`) are planned apart, in the same order: they are never in a
segment (no hop, no wait); the agent hands each stage's end to them
(hookbus.services.orchestrator.loop.observer_handoff).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from hookbus.skills.descriptors import HookDescriptor, ToolDescriptor
from hookbus.skills.lifecycle import Lifecycle
from hookbus.skills.skill import BoundHook, BoundTool


@dataclass(frozen=True, slots=True)
class PlannedHook:
    """A hook in the plan: its descriptor, and where it runs (`group` None: in this process,
    through `local`)."""

    descriptor: HookDescriptor
    group: str | None = None
    local: BoundHook | None = None

    @property
    def key(self) -> str:
        return self.descriptor.key

    @property
    def critical(self) -> bool:
        return self.descriptor.critical

    @property
    def timeout(self) -> float | None:
        return self.descriptor.timeout


@dataclass(frozen=True, slots=True)
class Segment:
    """Consecutive hooks that run in one place: in-process (group None) or one hop."""

    group: str | None
    hooks: tuple[PlannedHook, ...]

    def local_hooks(self) -> list[BoundHook]:
        return [h.local for h in self.hooks if h.local is not None]


@dataclass(frozen=True, slots=True)
class PlannedTool:
    """A tool in the catalogue: its descriptor, and where it runs (`group` None: `local`)."""

    descriptor: ToolDescriptor
    group: str | None = None
    local: BoundTool | None = None

    @property
    def name(self) -> str:
        return self.descriptor.name

    @property
    def timeout(self) -> float | None:
        return self.descriptor.timeout


@dataclass
class HookPlan:
    """Ordered hooks per lifecycle (observers apart) and the tool catalogue; segment and
    observer lists are cached per scope set."""

    by_lifecycle: dict[Lifecycle, tuple[PlannedHook, ...]]
    tools: dict[str, PlannedTool]
    observers_by_lifecycle: dict[Lifecycle, tuple[PlannedHook, ...]] = field(default_factory=dict)
    _segments: dict[tuple[Lifecycle, tuple[str, ...]], tuple[Segment, ...]] = field(default_factory=dict)
    _observers: dict[tuple[Lifecycle, tuple[str, ...]], tuple[PlannedHook, ...]] = field(default_factory=dict)
    _windowed: HookPlan | None = None

    @classmethod
    def build(
        cls,
        local_hooks: Sequence[BoundHook],
        local_tools: Sequence[BoundTool],
        remote_hooks: Iterable[PlannedHook] = (),
        remote_tools: Iterable[PlannedTool] = (),
    ) -> HookPlan:
        """`remote_hooks` in the order groups first registered, each group's in the order
        it announced them (that order breaks priority ties after the in-process hooks)."""
        ranked: list[tuple[tuple[int, int, int], PlannedHook]] = []
        for index, bound in enumerate(local_hooks):
            ranked.append(((bound.descriptor.priority, 0, index), PlannedHook(bound.descriptor, None, bound)))
        for index, remote in enumerate(remote_hooks):
            ranked.append(((remote.descriptor.priority, 1, index), remote))
        ranked.sort(key=lambda item: item[0])

        def of(point: Lifecycle, observe: bool) -> tuple[PlannedHook, ...]:
            return tuple(
                p for _, p in ranked if p.descriptor.lifecycle == point and p.descriptor.observe is observe
            )

        tools = {tool.name: tool for tool in remote_tools}
        for bound_tool in local_tools:  # in-process tools win a name clash
            tools[bound_tool.descriptor.name] = PlannedTool(bound_tool.descriptor, None, bound_tool)
        return cls(
            {point: of(point, False) for point in Lifecycle}, tools, {point: of(point, True) for point in Lifecycle}
        )

    def segments(self, lifecycle: Lifecycle, scopes: Sequence[str]) -> tuple[Segment, ...]:
        key = (lifecycle, tuple(scopes))
        cached = self._segments.get(key)
        if cached is None:
            hooks = _allowed(self.by_lifecycle[lifecycle], scopes)
            cached = tuple(
                Segment(group, tuple(members))
                for group, members in groupby(hooks, key=lambda h: h.group)
            )
            self._segments[key] = cached
        return cached

    def observers(self, lifecycle: Lifecycle, scopes: Sequence[str]) -> tuple[PlannedHook, ...]:
        """The observers of `lifecycle` that apply to a caller with `scopes`, in order."""
        key = (lifecycle, tuple(scopes))
        cached = self._observers.get(key)
        if cached is None:
            cached = _allowed(self.observers_by_lifecycle.get(lifecycle, ()), scopes)
            self._observers[key] = cached
        return cached

    def observes(self, scopes: Sequence[str]) -> bool:
        """Whether any stage has an observer for a caller with `scopes`."""
        return any(self.observers(point, scopes) for point in Lifecycle)

    def hold_back(self, scopes: Sequence[str]) -> int:
        """The widest on_chunk window (characters held back from the client) among the
        on_chunk hooks that apply to a caller with `scopes`; 0: none."""
        return max((h.descriptor.hold_back for h in _allowed(self.by_lifecycle[Lifecycle.ON_CHUNK], scopes)), default=0)

    def windowed(self) -> HookPlan:
        """This plan with only the on_chunk hooks that ask for a hold-back window, and no
        on_chunk observer: what judges a non-streamed answer (hookbus.services.orchestrator.
        loop.chunk_stage), where the other on_chunk hooks and observers never ran."""
        if self._windowed is None:
            guards = tuple(h for h in self.by_lifecycle[Lifecycle.ON_CHUNK] if h.descriptor.hold_back)
            self._windowed = HookPlan(
                {**self.by_lifecycle, Lifecycle.ON_CHUNK: guards},
                self.tools,
                {**self.observers_by_lifecycle, Lifecycle.ON_CHUNK: ()},
            )
        return self._windowed

    def tool_schemas(self, scopes: Sequence[str]) -> list[dict[str, Any]]:
        allowed = set(scopes)
        return [
            t.descriptor.parameters_schema for t in self.tools.values()
            if t.descriptor.scope == "all" or t.descriptor.scope in allowed
        ]


def _allowed(hooks: Iterable[PlannedHook], scopes: Sequence[str]) -> tuple[PlannedHook, ...]:
    allowed = set(scopes)
    return tuple(h for h in hooks if h.descriptor.scope == "all" or h.descriptor.scope in allowed)
