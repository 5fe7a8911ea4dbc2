"""A hook group that is down fails closed where it guards.

The fault: every replica of the group that hosts a guard is gone. A `before_toolcall`
hook that cannot run blocks the call (as a timeout would), and an `on_connection` hook
declared with `guard=True` refuses the request with 503 `guard_unavailable`; a hook
that is not a guard is still skipped.
"""

from __future__ import annotations

from typing import Any

import pytest

from hookbus import Agent, Context, HookData, HookError, Skill, hook, tool
from tests.integration.stack import running_stack
from tests.waiting import wait_for


class Terminal(Skill):
    """In the orchestrator: the tool the guard stands in front of, and a finalize record."""

    name = "terminal"

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.finalized: list[Any] = []

    @tool
    def run(self, command: str) -> str:
        """Run a command."""
        self.ran.append(command)
        return "done"

    @hook("finalize_connection")
    async def record(self, data: HookData, ctx: Context) -> None:
        self.finalized.append(data.error.code if data.error else None)


class ToolGuard(Skill):
    name = "tool-guard"

    @hook("before_toolcall", 1)
    async def check(self, data: HookData, ctx: Context) -> None:
        return None


class Gatekeeper(Skill):
    name = "gatekeeper"

    @hook("on_connection", 1, guard=True)
    async def admit(self, data: HookData, ctx: Context) -> None:
        return None


class Greeter(Skill):
    name = "greeter"

    @hook("on_connection", 2)
    async def greet(self, data: HookData, ctx: Context) -> None:
        return None


async def with_group_down(services, workers, group: str = "guards") -> None:
    for worker in workers:
        await worker.stop()
    async def down() -> bool:
        return not any(s.runtime.registry.is_live(group) for s in services)

    assert await wait_for(down, timeout=5)


async def test_a_tool_call_is_blocked_when_its_before_toolcall_group_is_down(redis_url, prefix):
    terminal = Terminal()
    agent = Agent("g", skills=[terminal])
    async with running_stack(redis_url, prefix, agent, {"guards": [ToolGuard()]}) as (client, services, workers):
        assert (await client.complete('[[tool:run {"command": "ls"}]]')).choices[0].message.content == (
            "The tool run returned: done"
        )
        await with_group_down(services, workers)
        completion = await client.complete('[[tool:run {"command": "ls"}]]')
    assert terminal.ran == ["ls"]  # only the call made while the guard was up
    text = completion.choices[0].message.content or ""
    assert "Tool call blocked by tool-guard.check" in text and "no live replica" in text


async def test_a_request_is_refused_when_its_on_connection_guard_group_is_down(redis_url, prefix):
    terminal = Terminal()
    agent = Agent("g", skills=[terminal])
    groups = {"guards": [Gatekeeper()], "greeters": [Greeter()]}
    async with running_stack(redis_url, prefix, agent, groups) as (client, services, workers):
        # a group that guards nothing may be down: its hooks are skipped
        await with_group_down(services, [w for w in workers if w.group == "greeters"], "greeters")
        assert (await client.complete("[[echo]] hi")).choices[0].message.content == "hi"
        await with_group_down(services, [w for w in workers if w.group == "guards"])
        with pytest.raises(HookError) as refused:
            await client.complete("[[echo]] hi")
    assert refused.value.status_code == 503 and refused.value.code == "guard_unavailable"
    assert terminal.finalized == [None, "guard_unavailable"]  # finalize ran for the refused request


async def test_a_guard_that_raises_refuses_the_request_in_process_too():
    class Broken(Skill):
        name = "broken"

        @hook("on_connection", guard=True)
        async def admit(self, data: HookData, ctx: Context) -> None:
            raise RuntimeError("policy service unreachable")

    with pytest.raises(HookError) as refused:
        await Agent("g", skills=[Broken()]).run("hi")
    assert refused.value.status_code == 503 and refused.value.code == "guard_unavailable"
    assert "RuntimeError" not in refused.value.message  # the exception is the log's, not the client's


def test_a_guard_on_finalize_connection_is_refused_at_definition():
    with pytest.raises(ValueError, match="guard"):
        hook("finalize_connection", guard=True)
