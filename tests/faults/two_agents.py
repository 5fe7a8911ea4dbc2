"""Two agents and their own worker groups, for `hookbus orchestrator --agent` and `hookbus
worker` subprocesses (tests/faults/test_agents_by_name.py).

The answers say who handled the request: the agents' in-process tool `where` returns the
orchestrator's name (`HOOKBUS_TEST_NAME`), and each agent's group marks every chunk, the
support desk upper-casing it, the ledger lower-casing it. A group's hook that gets a request
of another agent fails it (a 500 `wrong_agent`), so a misrouted hop cannot go unnoticed.
"""

from __future__ import annotations

import os
from typing import ClassVar

from hookbus import Agent
from hookbus.skills import Context, HookData, HookError, Skill, hook, tool


class Where(Skill):
    name = "where"

    @tool
    def where(self) -> str:
        """Name the orchestrator running this request."""
        return os.environ.get("HOOKBUS_TEST_NAME", f"pid{os.getpid()}")


class AgentMark(Skill):
    """Marks every chunk of its own agent's requests; fails a request of any other agent."""

    own: ClassVar[str] = ""

    def mark(self, text: str) -> str:
        return text

    @hook("on_chunk")
    def mark_chunk(self, data: HookData, ctx: Context) -> HookData:
        if ctx.metadata.agent_name != self.own:
            raise HookError(500, "wrong_agent", f"{self.own}'s group got a request of {ctx.metadata.agent_name!r}")
        if data.content:
            data.content = self.mark(data.content)
        return data


class SupportDesk(AgentMark):
    name = "support-desk"
    agents = ("support",)
    own = "support"

    def mark(self, text: str) -> str:
        return text.upper()


class BillingLedger(AgentMark):
    name = "billing-ledger"
    agents = ("billing",)
    own = "billing"

    def mark(self, text: str) -> str:
        return text.lower()


support = Agent("support", instructions="Help customers.", skills=[Where()])
billing = Agent("billing", instructions="Answer billing questions.", skills=[Where()])
