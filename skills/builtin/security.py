"""SecuritySkill: blocks dangerous tool calls before they run.

A denylist is a seatbelt, not a sandbox: it catches the common ways a model (or a prompt
injection steering it) writes a destructive command, never every way. A tool that can
run arbitrary commands needs an allowlist (`allowed_tools`) and a sandbox of its own.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import re2  # linear-time matching (RE2); no type stubs

from hookbus.skills.builtin._common import as_list, env_list, logger
from hookbus.skills.builtin.shell_words import CommandLine, command_name, parse
from hookbus.skills.context import Context
from hookbus.skills.data import HookData
from hookbus.skills.decorators import hook
from hookbus.skills.skill import Skill

LOGGER_NAME = "hookbus.skills.security"

DEFAULT_BLOCKED_TOOLS = ("shell", "exec", "delete_file", "drop_table")
DEFAULT_BLOCKED_PATTERNS = (
    r"\bdrop\s+(?:table|database|schema)\b",
    r"\btruncate\s+(?:table\s+)?(?:only\s+)?[\w.\"`\[\]]+\s*(?:;|,|$|\bcascade\b|\brestart\b|\bcontinue\b)",
    r"\bmkfs(?:\.\w+)?\b",
    r"\bdd\b[^\n]*\bof=/dev/",
)
DEFAULT_MAX_ARGUMENT_CHARS = 16_384
"""Longer arguments are refused unread: this bounds the work one call can cost."""

SHELLS = frozenset(
    {"sh", "bash", "zsh", "dash", "ksh", "fish", "ash", "busybox", "eval", "source", ".",
     "python", "python3", "perl", "ruby", "node", "php"}
)
DECODERS = {"base64": {"-d", "--decode", "-D"}, "base32": {"-d", "--decode"}, "xxd": {"-r"}, "openssl": {"-d"}}
DOWNLOADERS = frozenset({"curl", "wget", "fetch"})

_SQL_EXECUTABLE_COMMENT = re2.compile(r"(?s)/\*!\d*(.*?)\*/")  # MySQL runs what is in /*! ... */
_SQL_COMMENT = re2.compile(r"(?s)/\*.*?\*/|--[^\n]*")
_BLANKS = re2.compile(r"\s+")


class SecuritySkill(Skill):
    """Blocks tool calls by tool name, by an allowlist, or by what their arguments would do.

    Its `before_toolcall` hook runs at priority 1, on the call as the model made it, and
    raises `PermissionError` with the reason; the SDK turns that into a block, so the tool
    does not run and the model gets the tool message
    `"Tool call blocked by security.check_tool_call: PermissionError: <reason>"`.
    Hooks that rewrite tool calls after it are trusted code and are not re-checked.

    What is checked, in every string of the decoded JSON arguments (keys and values) and
    the raw arguments text:
    - shell commands as a shell would split them (hookbus.skills.builtin.shell_words):
      `rm` with recursive and force flags in any spelling (`-rf`, `-r -f`, `--recursive
      --force`, quoted, `${IFS}`, brace lists, inside `sh -c '...'` or `$(...)`); data
      decoded (`base64 -d`, `xxd -r`, ...) in a command line that runs a shell or an
      interpreter; a download piped into a shell;
    - the blocked patterns (RE2 syntax, case-insensitive, linear-time), searched in the
      text, in it with SQL comments removed (`DROP/**/TABLE`), and in each shell command
      rejoined with single blanks (`DROP${IFS}TABLE`).
    Arguments longer than `max_argument_chars` are refused without being read.

    Configuration (arguments, else environment):
        blocked_tools: names refused (case-insensitive); `HOOKBUS_BLOCKED_TOOLS`
            (comma separated), default `shell,exec,delete_file,drop_table`.
        allowed_tools: if given, the only names allowed at all (allowlist mode);
            `HOOKBUS_ALLOWED_TOOLS`; default none (every tool not blocked may run).
        blocked_patterns: `HOOKBUS_BLOCKED_PATTERNS` (comma separated; write a literal
            comma as `\\x2c`), default: `DROP TABLE|DATABASE|SCHEMA`, `TRUNCATE [TABLE]
            name`, `mkfs`, `dd ... of=/dev/`. A pattern RE2 cannot compile (backreferences,
            lookarounds) is refused at construction.
        shell_checks: the shell command checks above; `HOOKBUS_SECURITY_SHELL_CHECKS`
            (`0` turns them off), default on.
        max_argument_chars: `HOOKBUS_SECURITY_MAX_ARGUMENT_CHARS`, default 16384.
        An environment list set to an empty string is empty.
    """

    name = "security"

    def __init__(
        self,
        *,
        blocked_tools: Iterable[str] | str | None = None,
        blocked_patterns: Iterable[str | re.Pattern[str]] | str | None = None,
        allowed_tools: Iterable[str] | str | None = None,
        shell_checks: bool | None = None,
        max_argument_chars: int | None = None,
    ) -> None:
        tools = (
            env_list("HOOKBUS_BLOCKED_TOOLS", DEFAULT_BLOCKED_TOOLS)
            if blocked_tools is None
            else as_list(blocked_tools)
        )
        self.blocked_tools = frozenset(name.casefold() for name in tools)
        if allowed_tools is None and os.environ.get("HOOKBUS_ALLOWED_TOOLS") is not None:
            allowed_tools = env_list("HOOKBUS_ALLOWED_TOOLS", ())
        self.allowed_tools = (
            None if allowed_tools is None else frozenset(n.casefold() for n in as_list(allowed_tools))
        )
        if blocked_patterns is None:
            patterns: list[str | re.Pattern[str]] = list(
                env_list("HOOKBUS_BLOCKED_PATTERNS", DEFAULT_BLOCKED_PATTERNS)
            )
        elif isinstance(blocked_patterns, str):
            patterns = list(as_list(blocked_patterns))
        else:
            patterns = list(blocked_patterns)
        self.blocked_patterns = tuple(_compile(p.pattern if isinstance(p, re.Pattern) else p) for p in patterns)
        if shell_checks is None:
            shell_checks = os.environ.get("HOOKBUS_SECURITY_SHELL_CHECKS", "1").strip() not in {"0", "false", "no", "off"}
        self.shell_checks = shell_checks
        if max_argument_chars is None:
            max_argument_chars = int(
                os.environ.get("HOOKBUS_SECURITY_MAX_ARGUMENT_CHARS") or DEFAULT_MAX_ARGUMENT_CHARS
            )
        self.max_argument_chars = max_argument_chars

    def violation(self, tool_call: dict[str, Any] | None) -> str | None:
        """Why this tool call must be refused, or None when it may run."""
        function = (tool_call or {}).get("function") or {}
        name = str(function.get("name") or "")
        if self.allowed_tools is not None and name.casefold() not in self.allowed_tools:
            return f"tool {name!r} is not on the security policy's allowlist"
        if name.casefold() in self.blocked_tools:
            return f"tool {name!r} is not allowed by the security policy"
        arguments = function.get("arguments")
        raw = arguments if isinstance(arguments, str) or arguments is None else json.dumps(arguments)
        if raw is not None and len(raw) > self.max_argument_chars:
            return (
                f"arguments of tool {name!r} are {len(raw)} characters; the security policy "
                f"checks at most {self.max_argument_chars} and refuses longer ones"
            )
        for text, as_shell in _texts(arguments):
            reason = self._text_violation(name, text, as_shell)
            if reason is not None:
                return reason
        return None

    def _text_violation(self, name: str, text: str, as_shell: bool) -> str | None:
        line = parse(text) if as_shell else CommandLine()
        if self.shell_checks:
            reason = _shell_violation(line)
            if reason is not None:
                return f"arguments of tool {name!r} {reason}"
        for variant in _variants(text, line):
            for pattern in self.blocked_patterns:
                match = pattern.search(variant)
                if match:
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


@dataclass(frozen=True)
class BlockedPattern:
    """A blocked pattern compiled by RE2: case-insensitive, linear-time in the text."""

    pattern: str
    compiled: Any = field(compare=False, repr=False)

    def search(self, text: str) -> Any:
        return self.compiled.search(text)


def _compile(pattern: str) -> BlockedPattern:
    options = re2.Options()
    options.case_sensitive = False
    try:
        return BlockedPattern(pattern, re2.compile(pattern, options))
    except re2.error as exc:
        raise ValueError(f"blocked pattern {pattern!r} is not RE2 syntax: {exc}") from None


# ------------------------------------------------------------------ shell checks


def _shell_violation(line: CommandLine) -> str | None:
    for argv in line.commands:
        if _removes_recursively_by_force(argv):
            return f"remove files recursively by force ({' '.join(argv)!r})"
    decoding = [argv for argv in line.commands if _decodes(argv)]
    if decoding and any(_runs(argv, SHELLS) for argv in line.commands):
        return f"run decoded data through a shell ({' '.join(decoding[0])!r})"
    for pipeline in line.pipelines:
        for k, stage in enumerate(pipeline[:-1]):
            if _runs(stage, DOWNLOADERS) and any(_runs(later, SHELLS) for later in pipeline[k + 1:]):
                return f"pipe a download into a shell ({' | '.join(' '.join(s) for s in pipeline)!r})"
    return None


def _runs(argv: list[str], names: frozenset[str]) -> bool:
    """Whether any word names one of `names` as a command (`sudo sh`, `xargs sh` too)."""
    return any(command_name([word]).casefold() in names for word in argv)


def _decodes(argv: list[str]) -> bool:
    """A decoder (`base64`, `xxd`, ...) with its decode flag after it (one pass: the
    flags of every decoder seen so far)."""
    flags: set[str] = set()
    for word in argv:
        if word in flags:
            return True
        flags |= DECODERS.get(command_name([word]).casefold(), set())
    return False


def _removes_recursively_by_force(argv: list[str]) -> bool:
    """`rm` with a recursive and a force flag after it, in any spelling (one pass: each
    `rm` starts over)."""
    recursive = force = options = False
    for word in argv:
        if command_name([word]).casefold() == "rm":
            recursive = force = False
            options = True
        elif not options:
            continue
        elif word == "--":
            options = False
        elif word.startswith("--"):
            option = word[2:].split("=", 1)[0]
            recursive |= bool(option) and "recursive".startswith(option)
            force |= bool(option) and "force".startswith(option)
        elif word.startswith("-"):
            recursive |= "r" in word or "R" in word
            force |= "f" in word
        if recursive and force:
            return True
    return False


# ------------------------------------------------------------------ texts


def _variants(text: str, line: CommandLine) -> Iterator[str]:
    """The text, the text with SQL comments removed, and each shell command rejoined."""
    yield text
    sql = _BLANKS.sub(" ", _SQL_COMMENT.sub(" ", _SQL_EXECUTABLE_COMMENT.sub(r" \1 ", text)))
    if sql != text:
        yield sql
    if line.commands:  # one line per command: `[^\n]*` in a pattern stays within one
        yield "\n".join(" ".join(argv) for argv in line.commands)


def _texts(arguments: Any) -> list[tuple[str, bool]]:
    """Every string inside the decoded arguments, then the raw arguments text; each with
    whether to read it as shell commands (the raw text only when it is not JSON: its
    strings are read one by one already)."""
    if arguments is None:
        return []
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    texts: list[str] = []
    try:
        _collect(json.loads(raw) if isinstance(arguments, str) else arguments, texts)
    except ValueError:
        return [(raw, True)]
    return [*((text, True) for text in texts), (raw, False)]


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
