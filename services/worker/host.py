"""The skills one worker group hosts, and how one hop is answered.

Pure of Redis: a hop goes in, a reply comes out. The hooks run through the same
`hookbus.skills.runner.run_hooks` as in-process ones, so error semantics are identical.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import structlog

from hookbus.bus.groups.registry import GroupAnnouncement
from hookbus.bus.groups.served_agents import check_agent_name
from hookbus.bus.wire.chunk_batch import (
    ChangeCheck,
    HeldText,
    dump_results,
    load_chunks,
    load_kept_chunks,
)
from hookbus.bus.wire.envelopes import HookTiming, HopEvent, HopReply
from hookbus.bus.wire.protocol_version import PROTOCOL
from hookbus.bus.wire.stream_text import MAX_KEPT_CHARS, KeptTexts
from hookbus.services.observability import tracing
from hookbus.skills import Context, HookData, Skill
from hookbus.skills.lifecycle import Lifecycle
from hookbus.skills.runner import HookOutcome, run_hooks
from hookbus.skills.skill import BoundHook, BoundTool
from hookbus.skills.toolcall import ToolProblem, invoke_tool

log = structlog.get_logger("hookbus.worker.host")


class UnknownHook(LookupError):
    """The hop names a hook this group does not host (a stale registry, or a bad event)."""


class GroupHost:
    def __init__(
        self, group: str, skills: Sequence[Skill], *, kept_chars: int = MAX_KEPT_CHARS,
        agents: Sequence[str] | None = None,
    ) -> None:
        """`kept_chars`: at most how many characters of stream text this replica keeps
        (hookbus.bus.wire.stream_text.KeptTexts). `agents`: the agents the group serves,
        chosen where it is deployed (`hookbus worker --agent`), whatever its skills name;
        None: the ones they name."""
        if not skills:
            raise ValueError(f"worker group {group!r} needs at least one skill")
        if agents is not None and not agents:
            raise ValueError(f"worker group {group!r}: name at least one agent, or none to take the skills' own")
        self.group = group
        self.skills = list(skills)
        self._agents = None if agents is None else sorted({check_agent_name(name) for name in agents})
        self.hooks: dict[str, BoundHook] = {
            h.key: h for skill in self.skills for h in skill.bound_hooks()
        }
        self.tools: dict[str, BoundTool] = {
            t.descriptor.name: t for skill in self.skills for t in skill.bound_tools()
        }
        self.texts = KeptTexts(kept_chars)
        """The text so far of the streams whose batched on_chunk hops came here (protocol 1.1)."""

    def announcement(self) -> GroupAnnouncement:
        return GroupAnnouncement(
            group=self.group,
            protocol=PROTOCOL,
            hooks=[h.descriptor for h in self.hooks.values()],
            tools=[t.descriptor for t in self.tools.values()],
            agents=self.agents,
        )

    @property
    def agents(self) -> list[str]:
        """The agents this group serves: those it was deployed for, else those its skills
        name, or every agent (empty) as soon as one skill names none."""
        if self._agents is not None:
            return self._agents
        if any(not skill.agents for skill in self.skills):
            return []
        return sorted({name for skill in self.skills for name in skill.agents})

    async def answer(
        self, event: HopEvent, attempt: int, replica: str, split: tuple[bytes, bytes | None] | None = None
    ) -> HopReply:
        """Run the hop's hooks (or tool) and build the reply; hop-level problems become `failure`.

        `split`: (Context JSON, HookData JSON) of a version 2 hop (hookbus.bus.wire.envelopes.hop_parts);
        the reply is then version 2 too, with the data as JSON only if the hooks changed it."""
        started = time.perf_counter()
        data_json: bytes | None = None
        answer: dict[str, Any]
        try:
            ctx = Context.model_validate_json(split[0]) if split is not None else Context.model_validate(event.ctx)
            if event.tool is not None:
                answer = {"tool_result": await self._call_tool(event, ctx)}
            else:
                answer, data_json = await self._run_hooks(event, ctx, attempt, split)
            answer["state"], answer["session"] = ctx.state, ctx.session.data
        except (UnknownHook, ValueError) as exc:
            answer, data_json = {"failure": str(exc)}, None
        # built once, with every field: cheaper than assigning them one by one afterwards
        return HopReply(
            hop_id=event.hop_id, completion_id=event.completion_id, replica=replica, v=event.v,
            duration_ms=(time.perf_counter() - started) * 1000, data_json=data_json, **answer,
        )

    def _bound(self, event: HopEvent) -> list[BoundHook]:
        bound = []
        for ref in event.hooks:
            hook = self.hooks.get(ref.key)
            if hook is None:
                raise UnknownHook(f"group {self.group!r} has no hook {ref.key!r}")
            bound.append(hook)
        return bound

    async def _run_hooks(
        self, event: HopEvent, ctx: Context, attempt: int, split: tuple[bytes, bytes | None] | None
    ) -> tuple[dict[str, Any], bytes | None]:
        """The reply's fields of a hook hop, and its changed data as JSON (split format only)."""
        bound = self._bound(event)
        data_json = split[1] if split is not None else None
        if event.chunks:
            if data_json is None:
                raise ValueError("a batched on_chunk hop needs its chunks in the 'd' field")
            return await self._run_chunks(event, bound, data_json, ctx, attempt)
        if split is not None:
            data = HookData.model_validate_json(data_json) if data_json else HookData(lifecycle=Lifecycle(event.lifecycle))
        else:
            data = HookData.model_validate(event.data or {"lifecycle": event.lifecycle})
        result = await run_hooks(
            bound, data, ctx, stage_key=event.stage_key, attempt=attempt, observe=tracing.hook_observer()
        )
        answer: dict[str, Any] = {
            "abort": result.abort.to_dict() if result.abort is not None else None,
            "blocked": result.blocked,
            "outcomes": _timings(result.outcomes),
        }
        if split is None:
            answer["data"] = result.data.model_dump(mode="json")
            return answer, None
        dumped = result.data.model_dump_json().encode()
        return answer, (dumped if dumped != data_json else None)

    async def _run_chunks(
        self, event: HopEvent, bound: list[BoundHook], raw: bytes, ctx: Context, attempt: int
    ) -> tuple[dict[str, Any], bytes | None]:
        """The chain over each chunk of the batch `raw` in turn (each sees the state the
        previous one left), up to a HookError; per hook, the reply's outcome sums its
        calls' time and keeps its first failure. A protocol 1.1 batch (`event.text`) gets
        each chunk's `full_content` from the stream's text kept here, extended in place
        chunk by chunk (the previous chunk's reference to it dropped once its hooks ran);
        without that text no hook runs and the reply asks for it."""
        kept = event.text
        chunks = load_chunks(raw) if kept is None else load_kept_chunks(raw)
        text: str | None = None
        if kept is not None:
            text = self.texts.take(kept, chunks[0].chunk_index or 0)
            if text is None:
                return {"needs_text": True}, None
        results: list[bytes | None] = []
        timings: dict[str, HookOutcome] = {}
        abort: dict[str, Any] | None = None
        changes = ChangeCheck(raw, kept=kept is not None)
        held = HeldText()
        observe = tracing.hook_observer()  # one span for the hop: the same for each chunk
        for chunk in chunks:
            if text is not None:
                text += chunk.content or ""
                chunk.set_internal(full_content=text)
            changes.before(chunk)
            held.give(chunk)
            result = await run_hooks(
                bound, chunk, ctx, stage_key=f"on_chunk#{chunk.chunk_index}", attempt=attempt, observe=observe
            )
            held.took(result.data)
            results.append(changes.after(result.data))
            if text is not None:
                chunk.set_internal(full_content=None)
                result.data.set_internal(full_content=None)
            _add_timings(timings, result.outcomes)
            if result.abort is not None:
                abort = result.abort.to_dict()
                break
        if kept is not None and text is not None:
            self.texts.keep(kept, text, (chunks[len(results) - 1].chunk_index or 0) + 1)
        answer = {"abort": abort, "processed": len(results), "outcomes": _timings(list(timings.values()))}
        return answer, (dump_results(results) if any(r is not None for r in results) else None)

    async def _call_tool(self, event: HopEvent, ctx: Context) -> str:
        assert event.tool is not None
        tool = self.tools.get(event.tool.name)
        if tool is None:
            raise UnknownHook(f"group {self.group!r} has no tool {event.tool.name!r}")
        try:
            return await invoke_tool(tool, event.tool.arguments, ctx)
        except ToolProblem as exc:
            return f"Error: {exc}"


def _add_timings(timings: dict[str, HookOutcome], outcomes: Sequence[HookOutcome]) -> None:
    """A chunk's outcomes into the batch's: per hook, its calls' time summed, its first failure kept."""
    for o in outcomes:
        timing = timings.get(o.hook)
        if timing is None:
            timings[o.hook] = HookOutcome(o.hook, o.duration_ms, o.outcome, o.error)
            continue
        timing.duration_ms += o.duration_ms
        if timing.error is None and o.error is not None:
            timing.outcome, timing.error = o.outcome, o.error


def _timings(outcomes: Sequence[HookOutcome]) -> list[HookTiming]:
    return [HookTiming(hook=o.hook, duration_ms=o.duration_ms, outcome=o.outcome, error=o.error) for o in outcomes]
