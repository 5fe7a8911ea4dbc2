"""One admitted request run to its end: its response writer fenced by its epoch, the agent's
run in its own task and trace span under the request's deadline, then the terminal item
stored and the entry acked in one step (so a request is acked only once finalize_connection
ran and its answer is stored).

Every response write checks the journal's epoch: a run whose request another orchestrator
claimed stops without writing again (fenced out), and a run asks before finalize_connection
whether it still owns its request (`Execution.still_owner`).

Each step a run completes is put on record in its journal (hookbus.bus.store.run_steps,
`_record_step`), so that an orchestrator that takes the request over when this one dies
runs it on from there (`RESUME`, with the steps to replay: `resumption`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import time
from collections.abc import Sequence
from typing import Any, Protocol

import redis.asyncio as aredis
import structlog
from openai.types.chat import ChatCompletionChunk
from pydantic_core import PydanticSerializationError
from redis.exceptions import ResponseError

from hookbus.bus.connection.retrying import RECONNECT_ERRORS
from hookbus.bus.keys import ORCHESTRATOR_GROUP, Keys
from hookbus.bus.store.journal import Journal
from hookbus.bus.store.response_stream import Ack, Fence, ResponseWriter
from hookbus.bus.store.run_steps import Resumption, StepLog, StepRecord
from hookbus.bus.wire.envelopes import REQUEST_START, MonitorRecord, RequestEnvelope, ResponseItem
from hookbus.services.console import request_link
from hookbus.services.gateway.cancel import CLIENT_STALLED
from hookbus.services.observability import tracing
from hookbus.services.orchestrator.loop.agent import Agent
from hookbus.services.orchestrator.loop.run_steps import RUN_STEPS, RunSteps, streamed_text
from hookbus.services.orchestrator.serving.bus_runtime import BusRuntime
from hookbus.services.orchestrator.serving.run_mode import RunMode
from hookbus.services.orchestrator.serving.run_table import Running, RunTable
from hookbus.skills import HookbusError
from hookbus.skills.errors import Cancelled, DeadlineExceeded, as_hookbus_error
from hookbus.skills.outcome import Outcome

log = structlog.get_logger("hookbus.orchestrator")

RESERVED_METADATA = frozenset({"completion_id", "model", "agent_name"})
SHUTDOWN_WAIT = 30.0
"""How long a stopping orchestrator waits for each thing it stops (a run's finalize, recoveries, observers)."""
OBSERVATIONS_WAIT = 2.0
"""How long a request's ack waits for its observation entries to be stored (Redis slow or away)."""
RECENTLY_OWNED = 0.25
"""How recent a response write that found the run's epoch current answers `still_owner`
(at most a quarter of `claim_idle`)."""


class ExecutionHost(Protocol):
    """What a run needs of the orchestrator service: its agent and settings, its run table,
    and the journal and runtime it built at start-up."""

    agent: Agent
    keys: Keys

    def agent_for(self, request: RequestEnvelope) -> Agent: ...

    instance: str
    claim_idle: float
    runs: RunTable
    journal: Journal | None
    runtime: BusRuntime | None

    @property
    def client(self) -> aredis.Redis: ...


class Execution:
    """The requests a service runs, one `execute` each, and what they ended with."""

    def __init__(self, service: ExecutionHost) -> None:
        self.service = service
        self.served = 0
        self.fenced = 0
        self._steps: StepLog | None = None

    @property
    def steps(self) -> StepLog:
        """The journals' step fields, on the service's client (built at start-up)."""
        if self._steps is None:
            assert self.service.journal is not None, "the service is not started"
            self._steps = StepLog(self.service.client, self.service.keys)
        return self._steps

    async def resumption(self, request: RequestEnvelope) -> Resumption | None:
        """Where a lost orchestrator left a request it had started, to run on from; None
        when it cannot go on unnoticed: a stream whose client already got text (a new LLM
        call would not continue that text, and the client must not get it twice)."""
        found = await self.steps.resumption(request.completion_id)
        if request.stream and (found.sent.text or streamed_text(found.records)):
            return None
        return found

    async def execute(
        self,
        run: Running,
        request: RequestEnvelope,
        mode: RunMode,
        *,
        first_seq: int = 0,
        error: HookbusError | None = None,
        resume: Resumption | None = None,
    ) -> bool:
        """Run (`RUN`), run on from `resume` (`RESUME`), finalize only (`RECOVER`), or only
        end (`END`) one request with the epoch in `run`, then store its terminal item and
        ack it. False if fenced out or left pending because Redis stayed unreachable. Once
        it ended here, the request no longer counts as served by the worker versions it was
        pinned to."""
        runtime = self.service.runtime
        assert runtime is not None
        try:
            with self.service.agent_for(request).serving_on(runtime):
                return await self._execute(run, request, mode, first_seq=first_seq, error=error, resume=resume)
        finally:  # fenced: its new owner runs it on and releases it
            runtime.pins.release(request.completion_id, ended=not run.fenced)

    async def _execute(
        self, run: Running, request: RequestEnvelope, mode: RunMode, *, first_seq: int,
        error: HookbusError | None, resume: Resumption | None,
    ) -> bool:
        service = self.service
        assert service.journal is not None and service.runtime is not None
        cid = request.completion_id
        fence = Fence(service.journal, cid, run.epoch, steps=list(resume.fields) if resume is not None else [])
        writer = ResponseWriter(
            service.client, service.keys.responses(cid),
            fence=fence,
            on_fenced=lambda: service.runs.fence_out(run),
            on_lost=lambda: service.runs.lose(run),
            first_seq=first_seq,
        )
        run.writer = writer
        if run.cancel_reason is not None and mode == RunMode.RUN:
            mode, error = RunMode.CANCELLED, Cancelled(f"the request was {run.cancel_reason}")
        if mode.runs:  # so that a running request shows its model and caller (the console)
            service.runtime.events.emit(
                MonitorRecord(
                    completion_id=cid, lifecycle=REQUEST_START, replica=service.instance,
                    model=request.model or service.agent_for(request).model, caller=request.auth.peer_user_id,
                    agent=service.agent_for(request).name,
                )
            )
        steps = RunSteps(
            resume.records if resume is not None else (), functools.partial(self._record_step, fence),
            epoch=run.epoch, by=service.instance, resumed=resume is not None,
            role_sent=resume is not None and resume.sent.role, streamed=request.stream,
        )
        terminal = await self._terminal_of_task(run, request, writer, mode, error, steps)
        if terminal is None or not await self._store(run, writer, terminal):
            return False
        await self._ended(run, request, writer, mode, terminal)
        return True

    async def _terminal_of_task(
        self, run: Running, request: RequestEnvelope, writer: ResponseWriter, mode: RunMode,
        error: HookbusError | None, steps: RunSteps,
    ) -> ResponseItem | None:
        """The run in a task of its own, waited for; its terminal item, or None once fenced out."""
        task = asyncio.create_task(
            self._produce(request, writer, mode, error), name=f"request-{request.completion_id}",
            context=_with_run(run, steps),  # its hooks' tasks see which run (and steps) they belong to
        )
        run.task = task
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:  # this process is stopping hard: let finalize finish
            task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait({task}, timeout=SHUTDOWN_WAIT)
            raise
        if run.fenced:
            await writer.close()
            self._fenced_out(run)
            return None
        if task.cancelled():
            reason = run.cancel_reason or "cancelled"
            return ResponseItem(
                kind="error", completion_id=request.completion_id,
                error=(run.stop_error or Cancelled(f"the request was {reason}")).to_dict(),
            )
        return task.result()

    async def _store(self, run: Running, writer: ResponseWriter, terminal: ResponseItem) -> bool:
        """The terminal item stored and the entry acked, in one fenced step, once the
        request's observations are; False if fenced out or Redis stayed unreachable."""
        assert self.service.runtime is not None
        cid = run.completion_id
        await self.service.runtime.observations.stored(cid, OBSERVATIONS_WAIT)
        try:
            stored = await writer.finish(terminal, ack=Ack(run.stream, ORCHESTRATOR_GROUP, run.entry_id))
        except RECONNECT_ERRORS as exc:
            await writer.close()
            log.error("request_left_pending", completion_id=cid, error=str(exc))
            return False
        if not stored:
            self._fenced_out(run)
        return stored

    async def _record_step(self, fence: Fence, steps: Sequence[tuple[int, StepRecord]]) -> bool:
        """Steps of a run on record (hookbus.services.orchestrator.loop.run_steps); False
        if it could not be (Redis unreachable or refusing, or an in-process hook left a
        value JSON cannot carry in `ctx.state`): the run goes on, and a takeover replays less."""
        try:
            fence.steps.extend(await self.steps.append(fence.completion_id, steps))
        except (*RECONNECT_ERRORS, ResponseError, PydanticSerializationError) as exc:
            keys = [record.key for _, record in steps]
            log.warning("step_not_recorded", completion_id=fence.completion_id, steps=keys, error=str(exc))
            return False
        return True

    def _fenced_out(self, run: Running) -> None:
        self.fenced += 1
        log.warning("request_fenced_out", completion_id=run.completion_id, epoch=run.epoch)

    async def _ended(
        self, run: Running, request: RequestEnvelope, writer: ResponseWriter, mode: RunMode, terminal: ResponseItem
    ) -> None:
        """A stored end counted, logged if it failed, and recorded for the monitor."""
        service = self.service
        assert service.runtime is not None
        cid = request.completion_id
        if run.stop_error is not None and run.stop_error.code == CLIENT_STALLED:
            # its client stopped reading and the gateway gave up on it: nobody reads this stream
            with contextlib.suppress(*RECONNECT_ERRORS):
                await service.client.delete(writer.stream)
        self.served += 1
        failure = terminal.error or {}
        if terminal.kind == "error":
            log.warning(
                "request_failed", completion_id=cid, status=failure.get("status_code"),
                error=failure.get("message"), console=request_link(cid),
            )
        service.runtime.events.emit(
            MonitorRecord(
                kind="request", completion_id=cid,
                lifecycle="request" if mode == RunMode.RUN else f"request:{mode}",
                replica=service.instance, duration_ms=(time.perf_counter() - run.started) * 1000,
                outcome=Outcome.OK if terminal.kind != "error" else Outcome.FAILED,
                error=failure.get("message"),
                model=request.model or service.agent_for(request).model, caller=request.auth.peer_user_id,
                agent=service.agent_for(request).name,
                status=int(failure.get("status_code", 500)) if terminal.kind == "error" else 200,
            )
        )

    async def still_owner(self, completion_id: str) -> bool:
        """Whether the run asking (the one whose task this is) may finalize its request:
        no, only when it knows it lost it (fenced out, or the journal's epoch is past its
        own: a peer claimed the request and runs its finalize). When in doubt, yes:
        finalize must run at least once, and every write after it is fenced anyway.

        A journal write that found the epoch ours less than RECENTLY_OWNED seconds ago (the
        run's begin or claim, or a response write) answers without asking Redis: a peer
        claims a request only after its owner's heartbeat was missing for `claim_idle`, or
        after it idled far longer, and a process that stalled since that write sees the
        time gone by. So a request answered within that time (most, not streamed) costs
        no round trip here."""
        run = _current_run.get()
        if run is None or run.completion_id != completion_id or not run.epoch:
            return True
        if run.fenced:
            return False
        owned_at = run.last_owned()
        if owned_at is not None and time.monotonic() - owned_at < min(RECENTLY_OWNED, self.service.claim_idle / 4):
            return True
        try:
            epoch = await self.service.client.hget(self.service.keys.journal(completion_id), "epoch")
        except RECONNECT_ERRORS:
            return True
        if epoch is not None and int(epoch) > run.epoch:
            self.service.runs.fence_out(run)
            return False
        return True

    async def _produce(
        self, request: RequestEnvelope, writer: ResponseWriter, mode: RunMode, error: HookbusError | None
    ) -> ResponseItem:
        """The run itself, in the request's span; returns the terminal item (never raises
        but for cancellation)."""
        with tracing.request_span(
            self.service.agent_for(request).name, request.completion_id, request.trace, mode,
            session_id=request.session_id,
        ) as span:
            terminal = await self._terminal_item(request, writer, mode, error)
            span.outcome(terminal.kind, terminal.error)
            return terminal

    async def _terminal_item(
        self, request: RequestEnvelope, writer: ResponseWriter, mode: RunMode, error: HookbusError | None
    ) -> ResponseItem:
        cid = request.completion_id
        try:
            if mode.runs:
                return await self._run_until_deadline(request, writer)
            assert error is not None
            if mode in (RunMode.RECOVER, RunMode.CANCELLED):
                await self.service.agent_for(request).finalize_only(
                    request.messages, completion_id=cid, error=error, auth=request.auth,
                    session_id=request.session_id, metadata=_metadata(request),
                    recovery=mode == RunMode.RECOVER,
                )
            raise error
        except HookbusError as exc:
            return ResponseItem(kind="error", completion_id=cid, error=exc.to_dict())
        except Exception as exc:  # noqa: BLE001 - the client must get an answer whatever broke
            log.exception("request_crashed", completion_id=cid)
            return ResponseItem(kind="error", completion_id=cid, error=as_hookbus_error(exc).to_dict())

    async def _run_until_deadline(self, request: RequestEnvelope, writer: ResponseWriter) -> ResponseItem:
        remaining = None if request.deadline is None else request.deadline - time.time()
        if remaining is not None and remaining <= 0:  # its client stopped waiting: run nothing
            raise DeadlineExceeded("the request's deadline passed before it started")
        try:
            async with asyncio.timeout(remaining):
                return await self._run(request, writer)
        except TimeoutError as exc:
            raise DeadlineExceeded() from exc

    async def _run(self, request: RequestEnvelope, writer: ResponseWriter) -> ResponseItem:
        agent = self.service.agent_for(request)
        kwargs: dict[str, Any] = {
            "auth": request.auth,
            "session_id": request.session_id,
            "completion_id": request.completion_id,
            "metadata": _metadata(request),
            "tools": request.tools,
            "model_settings": request.model_settings,
            "deadline": request.deadline,
            "model": request.model,
        }
        cid = request.completion_id
        if not request.stream:
            completion = await agent.run(request.messages, **kwargs)
            return ResponseItem(kind="final", completion_id=cid, completion=completion.model_dump(mode="json"))

        def progress(line: str) -> None:
            writer.add(ResponseItem(kind="progress", completion_id=cid, progress=line))

        first_output = True
        async for chunk in agent.run_stream(request.messages, on_progress=progress, **kwargs):
            at_once = first_output and _carries_output(chunk)
            first_output = first_output and not at_once
            writer.add(
                ResponseItem(kind="chunk", completion_id=cid, chunk=chunk.model_dump(mode="json", exclude_none=True)),
                at_once=at_once,
            )
        return ResponseItem(kind="done", completion_id=cid)


_current_run: contextvars.ContextVar[Running | None] = contextvars.ContextVar("hookbus_run", default=None)


def _with_run(run: Running, steps: RunSteps) -> contextvars.Context:
    context = contextvars.copy_context()
    context.run(_current_run.set, run)
    context.run(RUN_STEPS.set, steps)
    return context


def _metadata(request: RequestEnvelope) -> dict[str, Any]:
    return {k: v for k, v in request.metadata.items() if k not in RESERVED_METADATA}


def _carries_output(chunk: ChatCompletionChunk) -> bool:
    """Whether the chunk holds text or a tool call (not only a role or a finish reason):
    the answer's first such chunk is written without the response writer's linger."""
    return any(choice.delta.content or choice.delta.tool_calls for choice in chunk.choices)
