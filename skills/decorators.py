"""The two decorators a skill author uses: `@hook` and `@tool`.

Both only attach a descriptor (hookbus.skills.descriptors) to the function;
`Skill.__init_subclass__` collects them, so a mistake (an unknown lifecycle) fails when the
class is defined, not at run time. A tool also keeps the pydantic model its arguments are
validated with.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model

from hookbus.skills.descriptors import HookDescriptor, ToolDescriptor
from hookbus.skills.lifecycle import NOTIFICATIONS, Lifecycle, check_lifecycle

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_PRIORITY = 50
HOOK_ATTR = "__hookbus_hook__"
TOOL_ATTR = "__hookbus_tool__"


@dataclass(frozen=True)
class DeclaredTool:
    """What `@tool` attaches: the tool's descriptor and the model its arguments are validated with."""

    descriptor: ToolDescriptor
    arguments: type[BaseModel]


def hook(
    lifecycle: Lifecycle | str,
    priority: int = DEFAULT_PRIORITY,
    *,
    scope: str = "all",
    timeout: float | None = None,
    critical: bool = False,
    guard: bool = False,
    observe: bool = False,
    hold_back: int = 0,
) -> Callable[[F], F]:
    """Register a method as a hook on `lifecycle` (a `Lifecycle`, or its name: "on_chunk");
    lower `priority` runs first.

    `scope` other than "all" runs only for callers holding that scope; `timeout`
    (seconds) counts as a failure when exceeded; `critical=True` turns a plain
    exception into a 500 that aborts the run instead of being logged and skipped.
    `guard=True` makes the hook a check the request may not pass unchecked: when it
    cannot give its verdict (its worker group has no live replica, it times out, or it
    raises a plain exception) the request is refused with 503 `guard_unavailable`
    (finalize_connection still runs). A `before_toolcall` hook needs no flag: one that
    cannot run always blocks its tool call.

    `observe=True` makes the hook an observer: it gets the stage's data as the stage ended
    and the request's context, after the stage and off the request's path (no request
    waits for it); what it returns is ignored, what it raises is logged and recorded
    (hookbus.skills.observing). `hold_back=N` (on_chunk only) holds up to N characters of
    the model's text back from the client until this hook judged the text after them,
    so a HookError it raises stops text the client never received.
    """
    point = check_lifecycle(lifecycle)
    _check_kind(point, observe=observe, guard=guard, critical=critical, hold_back=hold_back)
    if timeout is not None and timeout <= 0:
        raise ValueError(f"hook timeout must be positive, got {timeout}")
    if guard and point in NOTIFICATIONS:
        raise ValueError(f"a {point} hook cannot be a guard: it has nothing to let through or refuse")
    descriptor = HookDescriptor(
        lifecycle=point, priority=int(priority), scope=scope, timeout=timeout,
        critical=critical, guard=guard, observe=observe, hold_back=int(hold_back),
    )

    def decorate(method: F) -> F:
        setattr(method, HOOK_ATTR, descriptor)
        return method

    return decorate


def _check_kind(lifecycle: str, *, observe: bool, guard: bool, critical: bool, hold_back: int) -> None:
    """An observer cannot stop anything, so it cannot be a guard or critical; a window
    only holds streamed text back, for a hook that judges it."""
    if observe and (guard or critical):
        raise ValueError("an observer (observe=True) cannot be a guard or critical: it never stops the request")
    if hold_back < 0:
        raise ValueError(f"hold_back must be >= 0 characters, got {hold_back}")
    if hold_back and lifecycle != "on_chunk":
        raise ValueError(f"hold_back holds streamed text back: only on_chunk hooks take it, not {lifecycle}")
    if hold_back and observe:
        raise ValueError("hold_back is for a hook that judges the text before the client sees it, not an observer")


def tool(
    method: F | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    scope: str = "all",
    timeout: float | None = None,
) -> Any:
    """Make a method an OpenAI function tool; its JSON schema comes from its signature.

    Usable bare (`@tool`) or with options (`@tool(name=..., scope=...)`). Parameter
    descriptions come from the docstring's `Args:` section.
    """

    def decorate(fn: F) -> F:
        setattr(fn, TOOL_ATTR, declare_tool(fn, name, description, scope, timeout))
        return fn

    return decorate(method) if method is not None else decorate


def declare_tool(
    fn: Callable[..., Any],
    name: str | None = None,
    description: str | None = None,
    scope: str = "all",
    timeout: float | None = None,
) -> DeclaredTool:
    doc = inspect.getdoc(fn) or ""
    summary, arg_docs = _parse_docstring(doc)
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.name in ("self", "cls") or param.kind in (
            param.VAR_POSITIONAL,
            param.VAR_KEYWORD,
        ):
            continue
        if param.name == "ctx":  # the request context is injected, not asked of the model
            continue
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, Field(default, description=arg_docs.get(param.name)))
    tool_name = name or fn.__name__
    arguments = create_model(
        f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields
    )
    parameters = arguments.model_json_schema()
    parameters.pop("title", None)
    schema = {
        "type": "function",
        "function": {
            "name": tool_name,
            "description": description or summary or tool_name,
            "parameters": parameters,
        },
    }
    return DeclaredTool(
        ToolDescriptor(name=tool_name, parameters_schema=schema, scope=scope, timeout=timeout), arguments
    )


_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters):\s*$")
_ARG_LINE = re.compile(r"^\s+(\w+)(?:\s*\([^)]*\))?:\s*(.+)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its summary and per-argument descriptions."""
    lines = doc.splitlines()
    summary_lines: list[str] = []
    arg_docs: dict[str, str] = {}
    in_args = False
    for line in lines:
        if _ARGS_HEADER.match(line):
            in_args = True
            continue
        if in_args:
            match = _ARG_LINE.match(line)
            if match:
                arg_docs[match.group(1)] = match.group(2).strip()
            elif line.strip() and not line.startswith((" ", "\t")):
                in_args = False
        elif not arg_docs:
            summary_lines.append(line)
    return " ".join(part.strip() for part in summary_lines if part.strip()), arg_docs
