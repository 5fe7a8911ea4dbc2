"""Command lines split the way a shell splits them, for the SecuritySkill.

A pattern over the raw text misses what a shell would still run: `"rm" -rf /`, `r\\m -rf /`,
`rm -r -f /`, `rm --recursive --force /`, `rm${IFS}-rf${IFS}/`, `{rm,-rf,/}`, or a command
inside `sh -c '...'`, `$(...)` or backticks. Here a text becomes the commands a POSIX
shell would see (shlex tokens, `${IFS}` as a blank, brace lists expanded, quoted words
that hold a command line split again), each an argv list, with the pipelines they form.
This is a seatbelt's parser, not a shell: it errs towards finding commands.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

MAX_DEPTH = 3
"""How deep quoted command lines inside command lines are split again."""

_IFS = re.compile(r"\$\{IFS[^}]*\}|\$IFS\b")
_SEPARATORS = frozenset({";", "&&", "||", "&", "(", ")", ";;", "\n", "$", "<", ">", ">>", "<<", "<<<"})
_PIPE = "|"
_BRACE_LIST = re.compile(r"^\{([^{}]*,[^{}]*)\}$")
_NEEDS_SPLIT = re.compile(r"[\s;&|`$(){}]")


@dataclass
class CommandLine:
    """The commands of one text: argv lists, and the pipelines (lists of commands)."""

    commands: list[list[str]] = field(default_factory=list)
    pipelines: list[list[list[str]]] = field(default_factory=list)


def parse(text: str) -> CommandLine:
    line = CommandLine()
    _parse_into(text, line, 0)
    return line


def command_name(argv: list[str]) -> str:
    """argv[0] without its directory (`/bin/rm` is `rm`)."""
    return argv[0].rsplit("/", 1)[-1] if argv else ""


def _tokens(text: str) -> list[str]:
    text = _IFS.sub(" ", text).replace("`", " ; ").replace("\n", " ; ")
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # an unclosed quote: a shell would wait for more; take the words as they are
        return text.replace('"', " ").replace("'", " ").split()


def _expanded(token: str) -> list[str]:
    """A brace list `{rm,-rf,/}` is the words `rm -rf /` to bash."""
    match = _BRACE_LIST.match(token)
    return match.group(1).split(",") if match else [token]


def _parse_into(text: str, line: CommandLine, depth: int) -> None:
    pipeline: list[list[str]] = []
    argv: list[str] = []

    def end_command() -> None:
        nonlocal argv
        if argv:
            line.commands.append(argv)
            pipeline.append(argv)
        argv = []

    def end_pipeline() -> None:
        nonlocal pipeline
        end_command()
        if pipeline:
            line.pipelines.append(pipeline)
        pipeline = []

    for token in _tokens(text):
        if token == _PIPE:
            end_command()
        elif token in _SEPARATORS:
            end_pipeline()
        else:
            for word in _expanded(token):
                if depth < MAX_DEPTH and _NEEDS_SPLIT.search(word):
                    _parse_into(word, line, depth + 1)  # `sh -c 'rm -rf /'`, "$(rm -rf /)"
                argv.append(word)
    end_pipeline()
