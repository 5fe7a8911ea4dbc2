"""The code in the README and the docs pages (docs/*.md) is real code.

Every ```python block of README.md and docs/*.md compiles (top-level `await` allowed, as
in an async REPL); a block marked with an HTML comment right above it
(`<!-- readme-skills -->`) is run by a test here, wherever it lives, and must exist once.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from types import CodeType

import pytest

from hookbus import Agent, HookError

ROOT = Path(__file__).resolve().parents[2]
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


def compiled(block: Block) -> CodeType:
    return compile(block.code, str(block), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


@pytest.mark.parametrize("block", python_blocks(), ids=str)
def test_every_python_block_of_the_readme_and_the_docs_compiles(block: Block) -> None:
    compiled(block)


def test_the_pages_have_python_blocks_to_check() -> None:
    assert len(python_blocks()) >= 8
    assert {b.page.name for b in python_blocks()} >= {"README.md", "guide.md", "gateway.md"}


async def test_the_lifecycle_skills_run_in_an_agent() -> None:
    namespace: dict[str, object] = {}
    exec(compiled(marked_block("readme-skills")), namespace)
    skills = [namespace[name]() for name in (  # type: ignore[operator]
        "RequestLogger", "SecuritySkill", "ContentFilter", "PerformanceMonitor", "AnalyticsSkill",
    )]
    analytics = skills[-1]
    agent = Agent("readme", skills=skills)
    completion = await agent.run("[[echo]] well damn it")
    assert completion.choices[0].message.content == "well *** it"
    chunks = [c async for c in agent.run_stream("[[echo]] oh crap")]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "crap" not in text
    assert analytics.models["offline"] == 2  # type: ignore[attr-defined]


async def test_the_first_skill_refuses_a_caller_without_credit_and_settles_every_path(capsys) -> None:
    namespace: dict[str, object] = {}
    exec(compiled(marked_block("first-skill")), namespace)
    run = eval(compiled(marked_block("first-skill-run")), namespace)  # noqa: S307 - the README's own code
    await run  # top-level await: the block is a coroutine
    printed = capsys.readouterr().out.splitlines()  # the block's prints, among log lines
    answer = printed.index("402 payment_required")
    assert any(line.startswith("Offline model reply to:") for line in printed[:answer])

    agent = Agent("first-skill", skills=[namespace["Billing"]()])  # type: ignore[operator]
    assert "balance" in agent.plan().tools
    with pytest.raises(HookError) as refused:
        await agent.run("hi", auth={"peer_user_id": "broke"}, session_id="s1")
    assert refused.value.status_code == 402
    await agent.run("hi", auth={"peer_user_id": "alice"}, session_id="s1")
    assert await agent.runtime.load_session("broke", "s1") == {
        "last_bill": {"outcome": "refused", "error": "payment_required"}
    }
    assert await agent.runtime.load_session("alice", "s1") == {"last_bill": {"outcome": "charged", "error": None}}
