"""OpenAI's `allowed_tools` tool_choice, narrowed to the plain forms.

`{"type": "allowed_tools", "allowed_tools": {"mode": "auto" | "required", "tools": [...]}}`
lets the model call only the listed tools. pydantic-ai sends it for its `ToolOrOutput`
setting (the function tools a run may use). Not every OpenAI-compatible endpoint knows it,
and the agent's tool rounds (and the offline model) read only the plain forms, so the gateway cuts the request's tools to
the listed ones and keeps the mode (a single required tool becomes the named-function
form). The agent's own tools are not in the client's list (the client does not know them)
and stay offered.
"""

from __future__ import annotations

from typing import Any, Literal, TypeGuard

from pydantic import BaseModel, Field, ValidationError


class FunctionName(BaseModel):
    name: str = Field(min_length=1)


class AllowedTool(BaseModel):
    type: Literal["function"]
    function: FunctionName


class AllowedTools(BaseModel):
    mode: Literal["auto", "required"]
    tools: list[AllowedTool] = Field(min_length=1)

    @property
    def names(self) -> list[str]:
        return [tool.function.name for tool in self.tools]

    def as_chat_choice(self) -> str | dict[str, Any]:
        if self.mode == "required" and len(set(self.names)) == 1:
            return {"type": "function", "function": {"name": self.names[0]}}
        return self.mode


def is_allowed_tools(choice: Any) -> TypeGuard[dict[str, Any]]:
    return isinstance(choice, dict) and choice.get("type") == "allowed_tools"


def parse_allowed_tools(choice: dict[str, Any]) -> AllowedTools:
    """The choice's list and mode; a ValueError that says what is wrong with a malformed one."""
    try:
        return AllowedTools.model_validate(choice.get("allowed_tools"))
    except ValidationError as exc:
        where = "; ".join(
            ".".join(str(p) for p in ("allowed_tools", *e["loc"])) + ": " + e["msg"] for e in exc.errors()[:3]
        )
        raise ValueError(
            "an allowed_tools tool_choice needs mode 'auto' or 'required' and tools "
            f"[{{type: function, function: {{name}}}}] ({where})"
        ) from None


def narrow_allowed_tools(document: dict[str, Any]) -> dict[str, Any]:
    """The request body with a well-formed `allowed_tools` choice narrowed (tools cut to the
    listed ones, the mode as tool_choice); any other body as it is (a malformed choice is
    left for the field's validation to refuse)."""
    choice = document.get("tool_choice")
    if not is_allowed_tools(choice):
        return document
    try:
        allowed = parse_allowed_tools(choice)
    except ValueError:
        return document
    narrowed = {**document, "tool_choice": allowed.as_chat_choice()}
    tools = document.get("tools")
    if isinstance(tools, list):
        kept = [tool for tool in tools if _name_of(tool) in (None, *allowed.names)]
        narrowed["tools"] = kept or None
    return narrowed


def _name_of(tool: Any) -> str | None:
    """A tool's function name; None for a malformed tool (kept, for validation to refuse)."""
    function = tool.get("function") if isinstance(tool, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None
