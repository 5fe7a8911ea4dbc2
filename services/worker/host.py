"""The skills one worker group hosts, and how one hop is answered.

Pure of Redis: a hop goes in, a reply comes out. The hooks run through the same
`skills.runner.run_hooks` as in-process ones, so error semantics are identical.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from bus.envelopes import HookTiming, HopEvent, HopReply
from bus.registry import GroupAnnouncement, HookDescriptor, ToolDescriptor
from skills import Context, HookData, Skill
from skills.runner import run_hooks
from skills.skill import BoundHook, BoundTool
from skills.toolcall import ToolProblem, invoke_tool


class UnknownHook(LookupError):
    """The hop names a hook this group does not host (a stale registry, or a bad event)."""


class GroupHost:
    def __init__(self, group: str, skills: Sequence[Skill]) -> None:
        if not skills:
            raise ValueError(f"worker group {group!r} needs at least one skill")
        self.group = group
        self.skills = list(skills)
        self.hooks: dict[str, BoundHook] = {
            h.key: h for skill in self.skills for h in skill.bound_hooks()
        }
        self.tools: dict[str, BoundTool] = {
            t.spec.name: t for skill in self.skills for t in skill.bound_tools()
        }

    def announcement(self) -> GroupAnnouncement:
        return GroupAnnouncement(
            group=self.group,
            hooks=[
                HookDescriptor(
                    skill=h.skill, method=h.method, lifecycle=h.spec.lifecycle,
                    priority=h.spec.priority, scope=h.spec.scope, timeout=h.spec.timeout,
                    critical=h.spec.critical,
                )
                for h in self.hooks.values()
            ],
            tools=[
                ToolDescriptor(
                    skill=t.skill, name=t.spec.name, parameters_schema=t.spec.openai_schema(),
                    scope=t.spec.scope, timeout=t.spec.timeout,
                )
                for t in self.tools.values()
            ],
        )

    async def answer(self, event: HopEvent, attempt: int, replica: str) -> HopReply:
        """Run the hop's hooks (or tool) and build the reply; hop-level problems become `failure`."""
        started = time.perf_counter()
        reply = HopReply(hop_id=event.hop_id, completion_id=event.completion_id, replica=replica)
        try:
            ctx = Context.model_validate(event.ctx)
            if event.tool is not None:
                reply.tool_result = await self._call_tool(event, ctx)
            else:
                await self._run_hooks(event, ctx, attempt, reply)
            reply.state = ctx.state
            reply.session = ctx.session.data
        except (UnknownHook, ValueError) as exc:
            reply.failure = str(exc)
        reply.duration_ms = (time.perf_counter() - started) * 1000
        return reply

    async def _run_hooks(self, event: HopEvent, ctx: Context, attempt: int, reply: HopReply) -> None:
        bound = []
        for ref in event.hooks:
            hook = self.hooks.get(ref.key)
            if hook is None:
                raise UnknownHook(f"group {self.group!r} has no hook {ref.key!r}")
            bound.append(hook)
        data = HookData.model_validate(event.data or {"lifecycle": event.lifecycle})
        result = await run_hooks(bound, data, ctx, stage_key=event.stage_key, attempt=attempt)
        reply.data = result.data.model_dump(mode="json")
        reply.abort = result.abort.to_dict() if result.abort is not None else None
        reply.blocked = result.blocked
        reply.outcomes = [
            HookTiming(hook=o.hook, duration_ms=o.duration_ms, outcome=o.outcome, error=o.error)
            for o in result.outcomes
        ]

    async def _call_tool(self, event: HopEvent, ctx: Context) -> str:
        assert event.tool is not None
        tool = self.tools.get(event.tool.name)
        if tool is None:
            raise UnknownHook(f"group {self.group!r} has no tool {event.tool.name!r}")
        try:
            return await invoke_tool(tool, event.tool.arguments, ctx)
        except ToolProblem as exc:
            return f"Error: {exc}"
