"""SecuritySkill: blocks dangerous tool calls before they run."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from hookbus.skills.builtin._common import as_list, env_list, logger
from hookbus.skills.context import Context
from hookbus.skills.data import HookData
from hookbus.skills.decorators import hook
from hookbus.skills.skill import Skill

LOGGER_NAME = "hookbus.skills.security"

DEFAULT_BLOCKED_TOOLS = ("shell", "exec", "delete_file", "drop_table")
DEFAULT_BLOCKED_PATTERNS = (
    r"\brm\s+-\w*(?:r\w*f|f\w*r)",  # rm -rf, rm -fr, rm -Rf, rm -vrf
    r"\bdrop\s+(?:table|database|schema)\b",
    r"\btruncate\s+table\b",
    r"\bmkfs(?:\.\w+)?\b",
    r"\bdd\b[^\n]*\bof=/dev/",
)


class SecuritySkill(Skill):
    """Blocks tool calls by tool name or by a dangerous pattern in their arguments.

    Its `before_toolcall` hook runs at priority 1, on the call as the model made it, and
    raises `PermissionError` with the reason; the SDK turns that into a block, so the tool
    does not run and the model gets the tool message
    `"Tool call blocked by security.check_tool_call: PermissionError: <reason>"`.
    Hooks that rewrite tool calls after it are trusted code and are not re-checked.

    Tool names match case-insensitively. Patterns are regular expressions searched
    case-insensitively in the raw arguments text and in every string (keys and values) of
    the decoded JSON arguments, so `"rm\\u0020-rf"` is caught too.

    Configuration:
        blocked_tools: tool names to refuse; env `HOOKBUS_BLOCKED_TOOLS`
            (comma separated), default `shell,exec,delete_file,drop_table`.
        blocked_patterns: regexes refused in arguments; env `HOOKBUS_BLOCKED_PATTERNS`
            (comma separated; write a literal comma as `\\x2c`), default: `rm -rf`,
            `DROP TABLE|DATABASE|SCHEMA`, `TRUNCATE TABLE`, `mkfs`, `dd ... of=/dev/`.
        Either env var set to an empty string disables that list.
    """

    name = "security"

    def __init__(
        self,
        *,
        blocked_tools: Iterable[str] | str | None = None,
        blocked_patterns: Iterable[str | re.Pattern[str]] | str | None = None,
    ) -> None:
        tools = (
            env_list("HOOKBUS_BLOCKED_TOOLS", DEFAULT_BLOCKED_TOOLS)
            if blocked_tools is None
            else as_list(blocked_tools)
        )
        self.blocked_tools = frozenset(name.casefold() for name in tools)
        if blocked_patterns is None:
            patterns: list[str | re.Pattern[str]] = list(
                env_list("HOOKBUS_BLOCKED_PATTERNS", DEFAULT_BLOCKED_PATTERNS)
            )
        elif isinstance(blocked_patterns, str):
            patterns = list(as_list(blocked_patterns))
        else:
            patterns = list(blocked_patterns)
        self.blocked_patterns = tuple(
            p if isinstance(p, re.Pattern) else re.compile(p, re.IGNORECASE) for p in patterns
        )

    def violation(self, tool_call: dict[str, Any] | None) -> str | None:
        """Why this tool call must be refused, or None when it may run."""
        function = (tool_call or {}).get("function") or {}
        name = str(function.get("name") or "")
        if name.casefold() in self.blocked_tools:
            return f"tool {name!r} is not allowed by the security policy"
        arguments = function.get("arguments")
        for text in _texts(arguments):
            for pattern in self.blocked_patterns:
                if match := pattern.search(text):
                    return (
                        f"arguments of tool {name!r} match the dangerous pattern "
                        f"{pattern.pattern!r} ({match.group(0)!r})"
                    )
        return None

    @hook("before_toolcall", 1)
    async def check_tool_call(self, data: HookData, ctx: Context) -> None:
        reason = self.violation(data.tool_call)
        if reason is None:
            return
        logger(LOGGER_NAME, ctx).warning(
            "tool_call_blocked",
            tool=((data.tool_call or {}).get("function") or {}).get("name"),
            tool_id=data.tool_id,
            caller=ctx.auth.peer_user_id,
            reason=reason,
        )
        raise PermissionError(reason)


def _texts(arguments: Any) -> list[str]:
    """The raw arguments text, then every string inside the decoded arguments."""
    if arguments is None:
        return []
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    texts = [raw]
    try:
        decoded = json.loads(raw) if isinstance(arguments, str) else arguments
    except ValueError:
        return texts
    _collect(decoded, texts)
    return texts


def _collect(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            out.append(str(key))
            _collect(item, out)
    elif isinstance(value, list | tuple):
        for item in value:
            _collect(item, out)
