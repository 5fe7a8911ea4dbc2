"""The demo agent `make run` and the deploy manifests start: `hookbus.services.orchestrator.demo:agent`.

It carries one in-process skill with two small tools; the built-in skills run in worker
groups. `hookbus run` starts it on the built-in offline model (HOOKBUS_MODEL=offline), which
calls a tool when the message says `[[tool:NAME {json}]]` (services/testing/offline_model.py);
the deploy manifests give it a real endpoint (OPENAI_BASE_URL).
"""

from __future__ import annotations

import datetime as dt

from hookbus.services.orchestrator.loop.agent import Agent
from hookbus.skills import Skill, tool


class DemoTools(Skill):
    name = "demo-tools"

    @tool
    def add(self, a: float, b: float) -> float:
        """Add two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b

    @tool
    def utc_now(self) -> str:
        """The current time in UTC, ISO 8601."""
        return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


agent = Agent(
    "demo",
    instructions="You are hookbus's demo agent. Use the tools when they help.",
    skills=[DemoTools()],
    # A small local model can call the same tool round after round; after three rounds the
    # agent asks for the answer with no tools offered, so the demo ends in seconds.
    max_tool_rounds=3,
)
