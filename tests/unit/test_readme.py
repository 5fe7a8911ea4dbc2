"""The README's skill examples are real code: run them through an agent."""

from __future__ import annotations

import re
from pathlib import Path

from hookbus import Agent

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_block(marker: str) -> str:
    text = README.read_text()
    match = re.search(rf"<!-- {marker} -->\n```python\n(.*?)```", text, re.S)
    assert match, f"README has no python block after <!-- {marker} -->"
    return match.group(1)


async def test_the_readme_lifecycle_skills_run_in_an_agent():
    namespace: dict[str, object] = {}
    exec(compile(readme_block("readme-skills"), "README.md", "exec"), namespace)
    skills = [namespace[name]() for name in (
        "RequestLogger", "SecuritySkill", "ContentFilter", "PerformanceMonitor", "AnalyticsSkill",
    )]
    analytics = skills[-1]
    agent = Agent("readme", skills=skills)
    completion = await agent.run("[[echo]] well damn it")
    assert completion.choices[0].message.content == "well *** it"
    chunks = [c async for c in agent.run_stream("[[echo]] oh crap")]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "crap" not in text
    assert analytics.models["offline"] == 2
