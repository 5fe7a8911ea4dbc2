"""The ```python blocks of README.md and docs/*.md, for the tests that compile and run them.

A block marked with an HTML comment on the line right above it (`<!-- first-skill -->`)
is found by its marker, wherever it lives (the README or any docs page), and must exist
once: a test that runs it keeps running it when the block moves to another page.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from types import CodeType

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"(?:<!-- ([\w-]+) -->\n)?```python\n(.*?)```", re.S)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    marker: str | None
    code: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def compiled(self, code: str | None = None) -> CodeType:
        """The block (or `code`, an edited copy of it) compiled; top-level `await` is
        allowed, as in an async REPL, and makes `eval` of the result a coroutine."""
        return compile(code or self.code, str(self), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def python_blocks() -> list[Block]:
    blocks = []
    for page in PAGES:
        text = page.read_text()
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start(2)) + 1
            blocks.append(Block(page, line, match.group(1), match.group(2)))
    return blocks


def marked_block(marker: str) -> Block:
    found = [b for b in python_blocks() if b.marker == marker]
    assert len(found) == 1, f"expected one python block after <!-- {marker} --> in README.md or docs/, found {len(found)}"
    return found[0]
