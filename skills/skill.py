"""The `Skill` base class: a named bundle of hooks and tools.

A skill is stateless across requests; the same class runs in the orchestrator's
process or in a worker group, whichever the deployment chooses.

A method named `on_compaction(self, outcome, ctx)` without `@hook` is a hook on
`on_compaction` too (the documented method form): it is registered like a decorated hook
(priority 50, key `<skill>.on_compaction`) and called with the outcome, and with ctx None
between turns.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel

from hookbus.skills.data import HookData
from hookbus.skills.decorators import DEFAULT_PRIORITY, HOOK_ATTR, TOOL_ATTR, DeclaredTool
from hookbus.skills.descriptors import HookDescriptor, ToolDescriptor
from hookbus.skills.lifecycle import Lifecycle

METHOD_FORM = "on_compaction"
"""The one hook a skill may define by its name alone: `on_compaction(outcome, ctx)`."""


@dataclass(frozen=True)
class BoundHook:
    """A hook method of one skill instance, ready to call, with its descriptor.

    `key` and `is_async` are worked out once here: the runner asks for them on every call
    (every chunk of a stream), where they cost more than calling a no-op hook."""

    descriptor: HookDescriptor
    fn: Callable[..., Any]
    key: str = field(init=False)
    is_async: bool = field(init=False)
    """`fn` is a coroutine function."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", self.descriptor.key)
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.fn))


@dataclass(frozen=True)
class BoundTool:
    """A tool method of one skill instance, ready to call, with its descriptor and the
    model its arguments are validated with."""

    descriptor: ToolDescriptor
    arguments: type[BaseModel]
    fn: Callable[..., Any]
    wants_ctx: bool


class Skill:
    """Subclass it, set `name`, decorate methods with `@hook` and `@tool`.

    Hooks and tools are collected when the class is defined, in definition order
    (inherited ones first), which is the tie-break order among equal priorities.
    """

    name: ClassVar[str] = ""
    version: ClassVar[str | None] = None
    """The skill's own version; a worker group of versioned skills runs at it when the
    deployment names none (hookbus.services.worker.versioning)."""
    agents: ClassVar[tuple[str, ...]] = ()
    """The agents (by name) whose requests this skill's hooks and tools serve when it runs
    in a worker group; empty: every agent. In-process, a skill serves the agent it is given to."""
    _hook_specs: ClassVar[tuple[tuple[str, HookDescriptor], ...]] = ()
    _tool_specs: ClassVar[tuple[tuple[str, DeclaredTool], ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("name"):
            cls.name = _kebab(cls.__name__)
        hook_specs: dict[str, HookDescriptor] = {}
        tool_specs: dict[str, DeclaredTool] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                if (spec := getattr(value, HOOK_ATTR, None)) is not None:
                    hook_specs[attr] = spec
                elif attr == METHOD_FORM and callable(value):
                    hook_specs[attr] = HookDescriptor(lifecycle=Lifecycle.ON_COMPACTION, priority=DEFAULT_PRIORITY)
                if (tspec := getattr(value, TOOL_ATTR, None)) is not None:
                    tool_specs[attr] = tspec
        cls._hook_specs = tuple(hook_specs.items())
        cls._tool_specs = tuple(tool_specs.items())

    def bound_hooks(self) -> list[BoundHook]:
        return [
            BoundHook(spec.model_copy(update={"skill": self.name, "method": method}), self._hook_callable(method))
            for method, spec in self._hook_specs
        ]

    def _hook_callable(self, method: str) -> Callable[..., Any]:
        fn: Callable[..., Any] = getattr(self, method)
        if method == METHOD_FORM and getattr(fn, HOOK_ATTR, None) is None:
            return _method_form(fn)
        return fn

    def bound_tools(self) -> list[BoundTool]:
        bound = []
        for method, spec in self._tool_specs:
            fn = getattr(self, method)
            wants_ctx = "ctx" in inspect.signature(fn).parameters
            descriptor = spec.descriptor.model_copy(update={"skill": self.name})
            bound.append(BoundTool(descriptor, spec.arguments, fn, wants_ctx))
        return bound



def _method_form(on_compaction: Callable[..., Any]) -> Callable[[HookData, Any], Any]:
    """`on_compaction(outcome, ctx)` called as a hook: `(data, ctx)` in, the outcome and
    (None between turns) the context out; what it returns is not the stage's data."""
    if inspect.iscoroutinefunction(on_compaction):

        async def call_async(data: HookData, ctx: Any) -> None:
            await on_compaction(data.compaction, None if data.between_turns else ctx)

        return call_async

    def call(data: HookData, ctx: Any) -> None:
        on_compaction(data.compaction, None if data.between_turns else ctx)

    return call


def _kebab(class_name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "-", class_name).lower()
