"""The code in the README and the docs pages (docs/*.md) is real code.

Every ```python block of README.md and docs/*.md compiles (top-level `await` allowed, as
in an async REPL); the blocks marked for it (tests.doc_blocks) run here through an agent,
and the gateway's in tests/gateway/test_docs_examples.py against a running gateway.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hookbus import Agent, HookError
from tests.doc_blocks import Block, marked_block, python_blocks


@pytest.mark.parametrize("block", python_blocks(), ids=str)
def test_every_python_block_of_the_readme_and_the_docs_compiles(block: Block) -> None:
    block.compiled()


def test_the_pages_have_python_blocks_to_check() -> None:
    assert len(python_blocks()) >= 8
    assert {b.page.name for b in python_blocks()} >= {"README.md", "guide.md", "gateway.md"}


async def test_the_lifecycle_skills_run_in_an_agent() -> None:
    namespace: dict[str, object] = {}
    exec(marked_block("readme-skills").compiled(), namespace)
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
    exec(marked_block("first-skill").compiled(), namespace)
    run = eval(marked_block("first-skill-run").compiled(), namespace)  # noqa: S307 - the README's own code
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


def test_the_running_an_agent_example_runs_as_written_on_a_machine_with_nothing_set(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL", "HOOKBUS_MODEL", "REDIS_URL")}
    done = subprocess.run(
        [sys.executable, "-c", marked_block("running-an-agent").code],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    answers = [line for line in done.stdout.splitlines() if line.startswith("Offline model reply to: hi")]
    assert len(answers) == 2, done.stdout  # the answer, then the streamed one
    assert "hiNone" not in done.stdout  # the streamed finish chunk prints nothing
