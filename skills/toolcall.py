"""Calls a skill's tool from the model's arguments, in-process or in a worker.

Every problem becomes text for the model (a tool message), never a crash: arguments
that are not JSON or fail validation, a tool that raises or times out.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any

from pydantic import ValidationError

from hookbus.skills.context import Context
from hookbus.skills.skill import BoundTool


class ToolProblem(Exception):
    """A tool call that cannot run or failed; its message is what the model is told."""


def parse_arguments(name: str, raw: str | None) -> dict[str, Any]:
    try:
        arguments = json.loads(raw or "{}")
    except json.JSONDecodeError as exc:
        raise ToolProblem(f"arguments for tool {name!r} are not valid JSON ({exc.msg})") from exc
    if not isinstance(arguments, dict):
        raise ToolProblem(f"arguments for tool {name!r} must be a JSON object")
    return arguments


async def invoke_tool(bound: BoundTool, arguments: dict[str, Any], ctx: Context) -> str:
    """Validate `arguments` against the tool's schema, call it, and render its result."""
    try:
        validated = bound.arguments.model_validate(arguments)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ToolProblem(f"invalid arguments for tool {bound.descriptor.name!r}: {problems}") from exc
    kwargs = {name: getattr(validated, name) for name in type(validated).model_fields}
    if bound.wants_ctx:
        kwargs["ctx"] = ctx
    try:
        if inspect.iscoroutinefunction(bound.fn):
            result = await asyncio.wait_for(bound.fn(**kwargs), bound.descriptor.timeout)
        elif bound.descriptor.timeout is None:
            result = bound.fn(**kwargs)
        else:
            result = await asyncio.wait_for(asyncio.to_thread(bound.fn, **kwargs), bound.descriptor.timeout)
    except TimeoutError as exc:
        raise ToolProblem(f"tool {bound.descriptor.name!r} timed out after {bound.descriptor.timeout}s") from exc
    except Exception as exc:  # noqa: BLE001 - the model hears about it instead
        raise ToolProblem(f"tool {bound.descriptor.name!r} failed: {type(exc).__name__}: {exc}") from exc
    return render_result(result)


def render_result(result: Any) -> str:
    if isinstance(result, str):
        return result
    if hasattr(result, "model_dump_json"):
        return str(result.model_dump_json())
    return json.dumps(result, default=str)
