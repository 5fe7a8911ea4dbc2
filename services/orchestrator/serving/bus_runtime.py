"""The runtime an orchestrator service gives its agent: hops to worker groups over Redis.

A hop that fails as a whole (no reply in time, no live replica, a reply in the wrong shape,
a dead-lettered event) counts as a failure of the segment's hooks, under the one set of
failure rules in hookbus.skills.runner (`fail_unanswered`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any, TypeVar

import pydantic_core
import structlog
from pydantic import ValidationError

from hookbus.bus.groups.registry import RegistryView
from hookbus.bus.hops.reply_router import HopLost, HopTimeout, ReplyRouter
from hookbus.bus.keys import Keys
from hookbus.bus.limits import over_hop_limits
from hookbus.bus.settings import get_settings
from hookbus.bus.store.events import EventWriter
from hookbus.bus.store.sessions import SessionStore
from hookbus.bus.wire.chunk_batch import ChunkIn, dump_chunks, load_results
from hookbus.bus.wire.envelopes import (
    LLM_RETRY,
    HookRef,
    HopEvent,
    HopReply,
    MonitorRecord,
    RouteStep,
    ToolInvocation,
    encode_hop,
)
from hookbus.bus.wire.stream_text import ChunkText
from hookbus.services.observability import tracing
from hookbus.services.orchestrator.loop.plan import PlannedHook, PlannedTool, Segment
from hookbus.services.orchestrator.loop.runtime import ChunkBatchResult
from hookbus.services.orchestrator.serving.observation_outbox import ObservationOutbox
from hookbus.services.orchestrator.serving.version_pins import VersionPins
from hookbus.skills import Context, HookbusError, HookData
from hookbus.skills.compaction_outcome import BETWEEN_TURNS_PREFIX
from hookbus.skills.lifecycle import Lifecycle
from hookbus.skills.runner import ChainResult, HookOutcome, Outcome, fail_unanswered

log = structlog.get_logger("hookbus.bus_runtime")

R = TypeVar("R")

DEFAULT_HOP_TIMEOUT = 30.0
HOP_GRACE = 0.25
"""Extra wait for a hop's reply beyond its hooks' timeouts: the worker enforces each hook's
timeout itself and answers with the other hooks' results, which needs transport time."""


class BusRuntime:
    def __init__(
        self,
        keys: Keys,
        router: ReplyRouter,
        registry: RegistryView,
        sessions: SessionStore,
        events: EventWriter,
        *,
        instance: str,
        default_timeout: float = DEFAULT_HOP_TIMEOUT,
        send_on: bool = True,
    ) -> None:
        """`send_on`: list a hop's next segments as its route, for its worker to send the
        stage on to (hookbus.bus.hops.send_on); False: every hop from here."""
        self.keys = keys
        self.router = router
        self.registry = registry
        self.sessions = sessions
        self.events = events
        self.instance = instance
        self.default_timeout = default_timeout
        self.send_on = send_on
        settings = get_settings()
        self.max_hop_bytes = settings.max_hop_bytes
        self.max_state_bytes = settings.max_state_bytes
        self.epoch = 0
        self.hops = 0
        """Hook and tool hops, those that workers sent on included."""
        self.forwarded = 0
        """Hops a worker sent on along a route (hookbus.bus.hops.send_on) instead of this runtime."""
        self.pins = VersionPins(registry.client, keys, registry)
        registry.on_refresh.append(self._end_lost_hops)
        self._remote_cache: tuple[int, tuple[PlannedHook, ...], tuple[PlannedTool, ...]] | None = None
        self.observations = ObservationOutbox(keys, router)
        self.texts_resent = 0
        """Batched on_chunk hops sent again with their stream's text (a replica lacked it)."""

    # ------------------------------------------------------------- registry view

    def remote_version(self) -> int:
        return self.registry.version

    def remote_hooks(self) -> Sequence[PlannedHook]:
        return self._remote()[1]

    def remote_tools(self) -> Sequence[PlannedTool]:
        return self._remote()[2]

    def _remote(self) -> tuple[int, tuple[PlannedHook, ...], tuple[PlannedTool, ...]]:
        version = self.registry.version
        if self._remote_cache is None or self._remote_cache[0] != version:
            hooks: list[PlannedHook] = []
            tools: list[PlannedTool] = []
            # registry order = tie-break; a refused group's hooks stay in the order and fail
            # unanswered (a critical one fails the request) rather than vanish; its tools go
            for group, announcement in self.registry.announced.items():
                hooks.extend(PlannedHook(h, group) for h in announcement.hooks)
                if group not in self.registry.refused:
                    tools.extend(PlannedTool(t, group) for t in announcement.tools)
            self._remote_cache = (version, tuple(hooks), tuple(tools))
        return self._remote_cache

    # ---------------------------------------------------------------------- hops

    async def hop(
        self, segment: Segment, data: HookData, ctx: Context, stage_key: str
    ) -> ChainResult:
        return (await self._stage_hop(segment, data, ctx, stage_key))[0]

    async def hop_segments(
        self, segments: Sequence[Segment], data: HookData, ctx: Context, stage_key: str
    ) -> AsyncGenerator[ChainResult, None]:
        """Consecutive remote segments of one stage, in turn, each on the data the one
        before left (hookbus.services.orchestrator.loop.runtime.Runtime.hop_segments). A hop lists the
        live segments after it as its route (hookbus.bus.hops.send_on); where its worker sent the
        stage on, the next segment's reply is waited for, not sent for. Not while tracing:
        each hop's span is the orchestrator's, from its send to its reply."""
        ahead: list[RouteStep] = []
        """The route's hops that workers are to send on, for the segments still to come."""
        try:
            for index, segment in enumerate(segments):
                if ahead:
                    sent, ahead = ahead[0], ahead[1:]
                    result, went_on = await self._stage_hop(
                        segment, data, ctx, stage_key, route=ahead, sent=sent.hop_id
                    )
                else:
                    ahead = await self._route(segment, segments[index + 1 :], ctx.completion_id)
                    result, went_on = await self._stage_hop(segment, data, ctx, stage_key, route=ahead)
                if not went_on:
                    self.router.forget(step.hop_id for step in ahead)
                    ahead = []
                yield result
                data = result.data
        finally:
            self.router.forget(step.hop_id for step in ahead)

    async def _route(self, segment: Segment, onward: Sequence[Segment], completion_id: str) -> list[RouteStep]:
        """The segments after `segment`'s hop that its worker may send the stage on to:
        those up to the first one in-process or in a group with no live replica (the
        stage then comes back here first); each to the stream of the version the request
        is pinned to in that group (hookbus.services.orchestrator.serving.version_pins). The hop's
        own group and the route's are pinned together, in one round trip."""
        if not self.send_on or tracing.enabled():
            return []
        groups = []
        for step in onward:
            if step.group is None or self.registry.unavailable(step.group) is not None:
                break
            groups.append(step.group)
        pin = _pins_versions(completion_id)
        if groups and pin:
            lead = [segment.group] if segment.group and self.registry.unavailable(segment.group) is None else []
            await self.pins.pin([*lead, *groups], completion_id)
        return [
            RouteStep(
                group=group, stream=await self.pins.stream_for(group, completion_id, pin=pin),
                hop_id=self.router.new_hop_id(), hooks=_hook_refs(step), timeout=self._segment_timeout(step),
            )
            for group, step in zip(groups, onward, strict=False)
        ]

    async def _stage_hop(
        self, segment: Segment, data: HookData, ctx: Context, stage_key: str,
        *, route: Sequence[RouteStep] = (), sent: str | None = None,
    ) -> tuple[ChainResult, bool]:
        """One segment's hop (`sent`: the id of the hop a worker sent it on as), and
        whether its worker sent the stage on to `route`'s first hop (the route it was
        sent with, or what is left of the route it came on)."""
        return await self._hook_hop(
            segment, ctx, data.lifecycle, stage_key,
            # the split format: data and context dumped once each, straight to JSON
            data.model_dump_json().encode() if sent is None else b"", self._segment_timeout(segment),
            apply=lambda reply: self._apply(reply, data, ctx),
            fail=lambda reason, outcome: _unanswered(segment, data, reason, outcome),
            route=route, sent=sent,
        )

    async def hop_chunks(self, segment: Segment, chunks: Sequence[ChunkIn], ctx: Context) -> ChunkBatchResult:
        """One hop for several chunks (hookbus.bus.wire.chunk_batch); its timeout allows every
        chunk its hooks' timeouts, as one hop per chunk would. To a group whose workers keep
        a stream's text (protocol 1.1) the hop carries its chunks and the text its live
        replicas lack; a replica that lacks more asks, and the batch goes again with the
        whole text so far (hookbus.bus.wire.stream_text)."""
        group = segment.group
        assert group is not None
        stream, first = chunks[0].text, chunks[0].index
        if not self.registry.keeps_text(group):
            result = await self._chunk_hop(segment, chunks, ctx, None)
        elif (result := await self._chunk_hop(segment, chunks, ctx, stream.ref_for(first, self.registry.replicas(group)))) is None:
            self.texts_resent += 1
            result = await self._chunk_hop(segment, chunks, ctx, stream.ref_for(first, (), whole=True))
        return result or _batch_unanswered(segment, chunks, "a replica lacked the text it was sent", Outcome.HOP_FAILED)

    async def _chunk_hop(
        self, segment: Segment, chunks: Sequence[ChunkIn], ctx: Context, text: ChunkText | None
    ) -> ChunkBatchResult | None:
        """One batched on_chunk hop (`text`: protocol 1.1's); None when its replica lacked
        the stream's text."""

        def apply(reply: HopReply) -> ChunkBatchResult | None:
            if text is None:
                return self._apply_chunks(reply, len(chunks), ctx, kept=False)
            stream = chunks[0].text
            if reply.needs_text:
                stream.answered(reply.replica, None)
                return None
            result = self._apply_chunks(reply, len(chunks), ctx, kept=True)
            stream.answered(reply.replica, chunks[0].index + reply.processed)
            return result

        result, _ = await self._hook_hop(
            segment, ctx, Lifecycle.ON_CHUNK, f"on_chunk#{chunks[0].index}", dump_chunks(chunks, kept=text is not None),
            self._segment_timeout(segment) * len(chunks), count=len(chunks), text=text, apply=apply,
            fail=lambda reason, outcome: _batch_unanswered(segment, chunks, reason, outcome),
        )
        return result

    async def _hook_hop(
        self, segment: Segment, ctx: Context, lifecycle: Lifecycle, stage_key: str, data_json: bytes,
        timeout: float, *, apply: Callable[[HopReply], R], fail: Callable[[str, Outcome], R], count: int = 0,
        route: Sequence[RouteStep] = (), sent: str | None = None, text: ChunkText | None = None,
    ) -> tuple[R, bool]:
        """Send a hook hop (split format) and wait for its reply, or (`sent`) wait for
        the reply of the hop a worker sent on: `apply` makes the result of a usable
        reply, `fail` the one of a hop nobody answered usably. Also whether the worker
        sent the stage on to `route`'s first hop."""
        group = segment.group
        assert group is not None
        keys = [h.key for h in segment.hooks]
        try:
            if sent is not None:
                self.hops += 1
                self.forwarded += 1
                self.pins.watch(sent, group, self.pins.pinned(ctx.completion_id).get(group))
                try:
                    reply = await self.router.wait(sent, timeout + HOP_GRACE)
                finally:
                    self.pins.unwatch(sent)
            elif (unavailable := self.registry.unavailable(group)) is not None:
                return fail(unavailable, Outcome.SKIPPED), False
            else:
                ctx_json = ctx.model_dump_json().encode()
                over = self._state_over_limit(ctx_json, ctx)
                if over is not None:
                    return fail(over, Outcome.HOP_FAILED), False
                event = HopEvent(
                    hop_id=self.router.new_hop_id(),
                    completion_id=ctx.completion_id,
                    lifecycle=lifecycle,
                    stage_key=stage_key,
                    hooks=_hook_refs(segment),
                    ctx={},
                    reply_to=self.router.reply_stream,
                    deadline=time.time() + timeout,
                    epoch=self.epoch,
                    chunks=count,
                    route=list(route) or None,
                    text=text,
                )
                self.router.expect([step.hop_id for step in route])
                reply = await self._call(group, event, timeout + HOP_GRACE, keys, (data_json, ctx_json))
        except HopTimeout as exc:
            return fail(str(exc), Outcome.TIMEOUT), False
        if reply.failure:
            return fail(f"worker group {group!r}: {reply.failure}", Outcome.HOP_FAILED), False
        try:
            result = apply(reply)
        except (ValidationError, ValueError, KeyError) as exc:
            log.warning("bad_hop_reply", group=group, hooks=keys, error=str(exc), completion_id=ctx.completion_id)
            return fail(f"reply in the wrong shape: {exc}", Outcome.HOP_FAILED), False
        return result, bool(route) and reply.forwarded == route[0].hop_id

    def _state_over_limit(self, ctx_json: bytes, ctx: Context) -> str | None:
        """Why the request's context may not ride this hop (its ctx.state over the limit,
        hookbus.bus.limits.over_hop_limits), None when it may; the state is measured only
        when the whole context is that large."""
        if len(ctx_json) <= self.max_state_bytes:
            return None
        state_bytes = len(pydantic_core.to_json(ctx.state))
        return over_hop_limits(0, state_bytes, self.max_hop_bytes, self.max_state_bytes)

    async def _call(
        self, group: str, event: HopEvent, timeout: float, hooks: Sequence[str],
        split: tuple[bytes, bytes] | None = None, *, pin: bool = True,
    ) -> HopReply:
        """Send one hop to `group` and wait for its reply (HopTimeout when none comes), in
        the hop's span, whose context the event carries. `split`: (HookData JSON, Context
        JSON) of a hook hop, sent in the split format (encode_hop). The hop goes to the
        version of `group` the request is pinned to (`pin=False`: a hop outside any
        request, to the newest version)."""
        pin = pin and _pins_versions(event.completion_id)
        while True:
            stream = await self.pins.stream_for(group, event.completion_id, pin=pin)
            version = self.pins.pinned(event.completion_id).get(group) if pin else None
            with tracing.hop_span(group, stream, event.lifecycle, hooks, version) as span:
                event.trace = span.carrier
                fields = encode_hop(event, *split) if split is not None else None
                self.hops += 1
                hop_id = event.hop_id
                self.pins.watch(hop_id, group, version)
                try:
                    reply = await self.router.call(stream, event, timeout, fields)
                except HopLost as exc:  # its version is gone: sent again, which moves the request
                    span.failed(str(exc), "lost")
                    log.warning("hop_taken_back", completion_id=event.completion_id, group=group,
                                version=version, hop_id=hop_id, reason=str(exc))
                    event.hop_id = self.router.new_hop_id()  # a late reply of the lost one is not this one's
                    event.deadline = time.time() + timeout
                    continue
                except HopTimeout as exc:
                    span.failed(str(exc), "timeout")
                    raise
                finally:
                    self.pins.unwatch(hop_id)
                span.replied(reply.replica, reply.failure, reply.outcomes)
                return reply

    def _end_lost_hops(self) -> None:
        """After each look at the replicas: the hops waiting for a version that is gone end
        their wait now (hookbus.services.orchestrator.serving.version_pins)."""
        for hop_id, why in self.pins.lost_hops():
            self.router.lost(hop_id, why)

    def _apply(self, reply: HopReply, data: HookData, ctx: Context) -> ChainResult:
        """A reply without data (the split format's "the hooks left it unchanged") keeps
        the caller's own HookData object."""
        if reply.data_json is not None:
            new_data = HookData.model_validate_json(reply.data_json)
        elif reply.data is not None:
            new_data = HookData.model_validate(reply.data)
        else:
            new_data = data
        if new_data.lifecycle != data.lifecycle:
            raise ValueError(f"reply is for {new_data.lifecycle}, not {data.lifecycle}")
        return ChainResult(new_data, *_taken(reply, ctx), reply.blocked)

    def _apply_chunks(self, reply: HopReply, sent: int, ctx: Context, *, kept: bool) -> ChunkBatchResult:
        """The batch reply's data: null (or a reply without data) for a chunk unchanged."""
        processed = reply.processed
        if not 0 < processed <= sent or (processed < sent and reply.abort is None):
            raise ValueError(f"reply ran {processed} of {sent} chunks")
        results: list[HookData | None] = (
            load_results(reply.data_json, kept=kept) if reply.data_json is not None else [None] * processed
        )
        if len(results) != processed:
            raise ValueError(f"reply has {len(results)} results for {processed} chunks")
        if any(r is not None and r.lifecycle != "on_chunk" for r in results):
            raise ValueError("reply is not for on_chunk")
        return ChunkBatchResult(results, *_taken(reply, ctx))

    def _segment_timeout(self, segment: Segment) -> float:
        return sum(h.timeout or self.default_timeout for h in segment.hooks)

    async def call_tool(self, tool: PlannedTool, arguments: dict[str, Any], ctx: Context) -> str:
        assert tool.group is not None
        if (unavailable := self.registry.unavailable(tool.group)) is not None:
            return f"Error: tool {tool.name!r} is unavailable: {unavailable}"
        timeout = tool.timeout or self.default_timeout
        event = HopEvent(
            hop_id=self.router.new_hop_id(),
            completion_id=ctx.completion_id,
            lifecycle="tool",
            stage_key=f"tool:{tool.name}",
            tool=ToolInvocation(name=tool.name, arguments=arguments),
            ctx=ctx.model_dump(mode="json"),
            reply_to=self.router.reply_stream,
            deadline=time.time() + timeout,
            epoch=self.epoch,
        )
        try:
            reply = await self._call(tool.group, event, timeout, [f"tool:{tool.name}"])
        except HopTimeout:
            return f"Error: tool {tool.name!r} timed out after {timeout:g}s"
        if reply.failure:
            return f"Error: tool {tool.name!r} failed: {reply.failure}"
        ctx.state = reply.state
        ctx.session.data = reply.session
        return reply.tool_result or ""

    # -------------------------------------------------------------- observations

    def send_observations(self, completion_id: str, entries: Sequence[tuple[str, dict[bytes, bytes]]]) -> None:
        """Off the request's path (hookbus.services.orchestrator.serving.observation_outbox):
        no stage waits for them; the request's ack does (`observations.stored`)."""
        self.observations.send(completion_id, entries)

    def record_observed(
        self, completion_id: str, lifecycle: Lifecycle, outcomes: Sequence[HookOutcome], duration_ms: float
    ) -> None:
        """An `observe` record, as a worker replica writes for its group's observers
        (group None: this process)."""
        self.events.emit(
            MonitorRecord.of_outcomes("observe", completion_id, lifecycle, outcomes, duration_ms,
                                      group=None, replica=self.instance)
        )

    # ------------------------------------------------------------ sessions, events

    async def load_session(self, owner: str | None, session_id: str) -> dict[str, Any]:
        return await self.sessions.load(owner, session_id)

    async def save_session(self, owner: str | None, session_id: str, data: dict[str, Any]) -> None:
        await self.sessions.save(owner, session_id, data)

    async def hold_tool_results(self, key: str, record: dict[str, Any]) -> None:
        await self.sessions.hold_tool_results(key, record)

    async def held_tool_results(self, keys: Sequence[str]) -> list[dict[str, Any] | None]:
        return await self.sessions.held_tool_results(keys)

    def record_stage(
        self,
        completion_id: str,
        lifecycle: Lifecycle,
        group: str | None,
        outcomes: Sequence[HookOutcome],
        duration_ms: float,
    ) -> None:
        self.events.emit(
            MonitorRecord.of_outcomes("stage", completion_id, lifecycle, outcomes, duration_ms,
                                      group=group, replica=self.instance)
        )


    def record_call(self, completion_id: str, lifecycle: str, name: str, duration_ms: float, error: str | None) -> None:
        self.events.emit(
            MonitorRecord(
                kind="stage", completion_id=completion_id, lifecycle=lifecycle, hooks=[name],
                replica=self.instance, duration_ms=duration_ms,
                outcome=Outcome.FAILED if error else Outcome.OK, error=error,
                model=name if lifecycle in ("llm_call", LLM_RETRY) else None,
            )
        )


def _pins_versions(completion_id: str) -> bool:
    """Whether hops of this id pin versions: not those of an on_compaction stage between
    turns, which belong to no request."""
    return not completion_id.startswith(BETWEEN_TURNS_PREFIX)


def _hook_refs(segment: Segment) -> list[HookRef]:
    return [HookRef(skill=h.descriptor.skill, method=h.descriptor.method) for h in segment.hooks]


def _taken(reply: HopReply, ctx: Context) -> tuple[list[HookOutcome], HookbusError | None]:
    """A usable reply's state and session into `ctx`; its outcomes and abort."""
    ctx.state = reply.state
    ctx.session.data = reply.session
    outcomes = [HookOutcome(o.hook, o.duration_ms, o.outcome, o.error) for o in reply.outcomes]
    return outcomes, HookbusError.from_dict(reply.abort) if reply.abort else None


def _unanswered(segment: Segment, data: HookData, reason: str, outcome: Outcome) -> ChainResult:
    return fail_unanswered(data, [h.descriptor for h in segment.hooks], reason, outcome)


def _batch_unanswered(segment: Segment, chunks: Sequence[ChunkIn], reason: str, outcome: Outcome) -> ChunkBatchResult:
    """The failure rules once for the batch: every chunk unchanged, or the run aborted
    at the first chunk (a critical hook)."""
    failed = _unanswered(segment, chunks[0].data(), reason, outcome)
    kept: list[HookData | None] = [failed.data] if failed.abort is not None else [None] * len(chunks)
    return ChunkBatchResult(kept, failed.outcomes, failed.abort)
