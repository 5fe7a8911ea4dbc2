"""finalize_connection: exactly once per request, on every path, whatever the caller does.

It runs shielded (a caller that cancels again meanwhile does not stop it), never replaces
the error that ended the run, closes the request's observations and saves its session. An
orchestrator that lost the request to a peer (fenced out while it stalled) skips it: the
peer finalized.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from hookbus.services.orchestrator.loop.host import LoopHost
from hookbus.services.orchestrator.loop.request_state import RequestState
from hookbus.services.orchestrator.loop.stage_runner import stage
from hookbus.skills import HookbusError, HookData
from hookbus.skills.errors import Cancelled
from hookbus.skills.lifecycle import Lifecycle

log = structlog.get_logger("hookbus.agent")


async def finalize_alone(host: LoopHost, state: RequestState) -> None:
    """Only finalize, for a request whose run was lost (`Agent.finalize_only`): the session
    is loaded first, as a run would have, and finalize runs even without it."""
    if state.ctx.session.id:
        try:
            state.ctx.session.data = await host.runtime.load_session(
                state.ctx.auth.peer_user_id, state.ctx.session.id
            )
        except Exception:  # noqa: BLE001 - finalize runs even without the session
            log.exception("session_load_failed", completion_id=state.completion_id)
    await finalize_shielded(host, state)


async def finalize_shielded(host: LoopHost, state: RequestState) -> None:
    """Run finalize to its end even if the caller cancels us again meanwhile."""
    task = asyncio.ensure_future(_finalize(host, state))
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled and state.error is None:
        state.error = Cancelled()


async def _finalize(host: LoopHost, state: RequestState) -> None:
    if not await _still_ours(host, state):
        log.warning("finalize_skipped_lost_request", completion_id=state.completion_id)
        return
    if state.plan.segments(Lifecycle.FINALIZE_CONNECTION, state.ctx.auth.scopes):
        # a takeover during finalize's hooks runs no stage again; with no hook to run, the
        # records would only be cleared by the request's end (one command for nothing)
        await state.steps.calling()
    data = HookData.model_construct(
        lifecycle=Lifecycle.FINALIZE_CONNECTION,
        messages=state.conversation,
        usage=state.usage,
        error=state.error,
    )
    try:
        await stage(host, state, data)
    except Exception:  # noqa: BLE001 - never replaces the original error
        log.exception("finalize_failed", completion_id=state.completion_id)
    if state.observations is not None:
        state.observations.close()
    if state.ctx.session.id:
        try:
            await host.runtime.save_session(
                state.ctx.auth.peer_user_id, state.ctx.session.id, state.ctx.session.data
            )
        except Exception:  # noqa: BLE001
            log.exception("session_save_failed", completion_id=state.completion_id)
    log.debug(
        "request_finished",
        completion_id=state.completion_id,
        error=state.error.code if state.error else None,
        ms=round((time.perf_counter() - state.started) * 1000, 2),
    )


def stop_error(host: LoopHost, state: RequestState) -> HookbusError | None:
    """Why the runtime stopped this run, when it did and not for the client (an
    orchestrator whose Redis lost the request's state); None for an in-process run."""
    check = getattr(host.runtime, "stop_error", None)
    return None if check is None else check(state.ctx)


async def _still_ours(host: LoopHost, state: RequestState) -> bool:
    """Whether this process may still finalize the request: an orchestrator that
    stalled and was fenced out (a peer claimed the request and finalized it) must not
    run finalize_connection again when it wakes. Asked of the runtime right before
    finalize; in-process runs always own theirs. A check that fails says yes:
    finalize must run at least once (every write after it is fenced anyway)."""
    check = getattr(host.runtime, "still_owner", None)
    if check is None:
        return True
    try:
        return bool(await check(state.ctx))
    except Exception:  # noqa: BLE001 - never the reason finalize is skipped
        log.exception("ownership_check_failed", completion_id=state.completion_id)
        return True
