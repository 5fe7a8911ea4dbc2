"""Running one stage: its hooks in priority order, segment by segment, then its observers.

In-process hooks run here (hookbus.skills.runner); consecutive remote segments go through
the runtime's `hop_segments`, so that a worker can send the stage on to the next group
itself (hookbus.bus.hops.send_on). Each segment's outcomes are recorded, and the runner's
rules decide whether the stage goes on after it.
"""

from __future__ import annotations

import contextlib
import time
from itertools import groupby

import structlog

from hookbus.services.observability import tracing
from hookbus.services.orchestrator.loop.host import LoopHost
from hookbus.services.orchestrator.loop.plan import HookPlan, Segment
from hookbus.services.orchestrator.loop.request_state import RequestState
from hookbus.services.orchestrator.loop.runtime import Runtime
from hookbus.skills import Context, HookData
from hookbus.skills.compaction_outcome import Compaction, between_turns_id
from hookbus.skills.context import Metadata
from hookbus.skills.lifecycle import NOTIFICATIONS, Lifecycle
from hookbus.skills.runner import ChainResult, run_hooks, stage_goes_on

log = structlog.get_logger("hookbus.agent")


def in_process(state: RequestState, lifecycle: Lifecycle) -> bool:
    """Whether in-process hooks run at this stage for this caller."""
    return any(segment.group is None for segment in state.plan.segments(lifecycle, state.ctx.auth.scopes))


def hookless(state: RequestState, lifecycle: Lifecycle) -> bool:
    """Whether no hook runs at this stage for this caller (observers aside: they change nothing)."""
    return not state.plan.segments(lifecycle, state.ctx.auth.scopes)


async def stage(host: LoopHost, state: RequestState, data: HookData, stage_key: str = "") -> HookData:
    """Run the stage's hooks (`run_stage`), then hand its end to its observers, if it has
    any (hookbus.services.orchestrator.loop.observer_handoff: they run off the request's path)."""
    observers = state.plan.observers(data.lifecycle, state.ctx.auth.scopes)
    if not observers or state.observations is None:
        return await run_stage(host.runtime, state.plan, state.ctx, data, stage_key)
    started = time.time()
    data = await run_stage(host.runtime, state.plan, state.ctx, data, stage_key)
    state.observations.record(observers, data, stage_key or data.lifecycle, started)
    return data


async def run_stage(runtime: Runtime, plan: HookPlan, ctx: Context, data: HookData, stage_key: str = "") -> HookData:
    """Run every hook of data.lifecycle in order, segment by segment; consecutive
    remote segments through the runtime's `hop_segments`, so that a worker can send the
    stage on to the next group itself (hookbus.bus.hops.send_on)."""
    lifecycle = data.lifecycle
    segments = plan.segments(lifecycle, ctx.auth.scopes)
    if not segments:
        return data
    key = stage_key or lifecycle
    with tracing.stage_span(lifecycle, stage_key):
        # a run of remote segments, or one in-process segment (its hooks are all together)
        for _, run in groupby(segments, key=lambda segment: segment.group is None):
            batch = tuple(run)
            started = time.perf_counter()
            if len(batch) > 1:
                async with contextlib.aclosing(runtime.hop_segments(batch, data, ctx, key)) as results:
                    position = 0
                    async for result in results:
                        data = result.data
                        if not _goes_on(runtime, ctx, batch[position], result, started):
                            return data
                        position += 1
                        started = time.perf_counter()
                continue
            segment = batch[0]
            if segment.group is None:
                result = await run_hooks(
                    segment.local_hooks(), data, ctx, stage_key=key, observe=tracing.hook_observer()
                )
            else:  # nothing to send on to: a plain hop, without the generator
                result = await runtime.hop(segment, data, ctx, key)
            data = result.data
            if not _goes_on(runtime, ctx, segment, result, started):
                return data
    return data


def _goes_on(runtime: Runtime, ctx: Context, segment: Segment, result: ChainResult, started: float) -> bool:
    """Record a segment's outcomes; whether the stage goes on after it (raises the
    abort that ends the run)."""
    lifecycle = result.data.lifecycle
    runtime.record_stage(
        ctx.completion_id, lifecycle, segment.group, result.outcomes, (time.perf_counter() - started) * 1000
    )
    if stage_goes_on(lifecycle, result.abort is not None, result.blocked):
        return True
    if result.abort is not None and lifecycle not in NOTIFICATIONS:
        raise result.abort
    return False


async def on_compaction(host: LoopHost, outcome: Compaction, ctx: Context | None) -> None:
    """The on_compaction stage, run like any other (hooks in-process and in worker groups
    in one priority order, the runner's rules; at a notification point a failure is
    recorded, never raised). Between turns (`ctx` None) the hooks get a context of no
    request, named after the compaction."""
    between_turns = ctx is None
    if ctx is None:
        ctx = Context(metadata=Metadata(
            completion_id=between_turns_id(outcome.id), model=host.model, agent_name=host.name
        ))
    data = HookData.model_construct(
        lifecycle=Lifecycle.ON_COMPACTION, compaction=outcome, between_turns=between_turns
    )
    try:
        await run_stage(host.runtime, host.plan(), ctx, data, f"{Lifecycle.ON_COMPACTION}:{outcome.id}")
    except Exception:  # noqa: BLE001 - telling hooks never breaks the run or the caller
        log.exception("on_compaction_failed", completion_id=ctx.completion_id)
