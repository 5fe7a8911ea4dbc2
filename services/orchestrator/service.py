"""The orchestrator service: consumes `requests` in group `orchestrators` and runs the agent.

Any number of instances share the queue. Each request's chunks, final completion or
error go to `responses:{completion_id}`; the request is acked only after
finalize_connection ran and the terminal item is stored, in the same atomic step.

Reliability (see bus/journal.py and services/orchestrator/recovery.py):

- a run starts by creating the request's journal (`begin`, one round trip that also
  reads the cancel marker); every response write and the final ack check the journal's
  epoch, so an owner that lost the request (it stalled and another orchestrator claimed
  it) stops without writing again;
- the requests it runs keep their claim (lease renewal every `claim_idle / 3` seconds),
  so a long LLM call is not taken away while this process is alive; heartbeats and lease
  renewal run on a thread of their own (bus/liveness.py), so a busy event loop is not
  taken for a dead process;
- a request another orchestrator left pending (it died, or it stalled for longer than
  `claim_idle`) is claimed: if it had started, the run goes on from the last step its
  journal records (each step is put on record as it ends: hookbus.bus.store.run_steps),
  with `ctx.recovery = True`; a stream whose client already got text cannot go on
  unnoticed, so only finalize_connection runs for it, with a 503 `orchestrator_lost`
  error, and the client gets that error; if it had not started, it simply runs;
- a request that cannot be read is dead-lettered; if its completion id is readable the
  client gets a 400 (or a 413 for one over its size limits: hookbus.bus.limits, the
  same limits the gateway applies, plus room for the envelope's own fields);
- a cancel signal (`{prefix}cancel:{completion_id}` marker, `{prefix}cancel` channel, as
  the gateway writes them) cancels the run: finalize runs with a 499 and the client gets
  that error;
- a janitor trims `requests` up to what was acked (bus/trim.py), and every few seconds
  each observer group's stream is kept within its bound, what it drops counted
  (hookbus.bus.groups.observer_backlog).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import re
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio as aredis
import structlog
from faststream.middlewares import AckPolicy
from faststream.redis import RedisStreamMessage, StreamSub
from openai.types.chat import ChatCompletionChunk
from pydantic_core import PydanticSerializationError
from redis.exceptions import ResponseError

from hookbus.bus.connection.cluster import forget_topology, in_order, keys_for, ready
from hookbus.bus.connection.retrying import (
    RECONNECT_ERRORS,
    connect,
    ensure_group,
    instance_name,
    raw_entry_parser,
    retryable,
)
from hookbus.bus.connection.values import text
from hookbus.bus.groups.dead_letters import add_dead_letter
from hookbus.bus.groups.observer_backlog import (
    CHECK_EVERY,
    BacklogBound,
    ObserverDrops,
    bound_observer_backlogs,
)
from hookbus.bus.groups.periodic import cancel_and_wait, repeat
from hookbus.bus.groups.registry import RegistryView
from hookbus.bus.groups.shard_reader import ShardedGroupReader
from hookbus.bus.groups.trim import TRIM_EVERY
from hookbus.bus.hops.reply_router import ReplyRouter
from hookbus.bus.keys import ORCHESTRATOR_GROUP
from hookbus.bus.limits import InvalidJSON, LimitExceeded, RequestLimits, check_document, parse_json
from hookbus.bus.settings import get_settings
from hookbus.bus.store.events import EventWriter
from hookbus.bus.store.journal import Begun, Journal
from hookbus.bus.store.response_stream import RESPONSE_TTL, Ack, Fence, ResponseWriter
from hookbus.bus.store.run_steps import Resumption, StepLog, StepRecord
from hookbus.bus.store.sessions import SessionStore
from hookbus.bus.wire.envelopes import (
    FIELD,
    REQUEST_START,
    DecodeError,
    MonitorRecord,
    RequestEnvelope,
    ResponseItem,
    decode,
    encode,
)
from hookbus.services.console import request_link
from hookbus.services.gateway.cancel import CLIENT_STALLED
from hookbus.services.observability import tracing
from hookbus.services.orchestrator.bus_runtime import BusRuntime
from hookbus.services.orchestrator.loop.agent import Agent
from hookbus.services.orchestrator.loop.run_steps import RUN_STEPS, RunSteps, streamed_text
from hookbus.services.orchestrator.recovery import Recovery
from hookbus.services.orchestrator.run_mode import RunMode
from hookbus.services.orchestrator.run_table import Running, RunTable
from hookbus.services.process.bus_app import BusApp
from hookbus.services.process.defaults import (
    ORCHESTRATOR_CLAIM_IDLE,
    ORCHESTRATOR_CONCURRENCY,
    ORCHESTRATOR_MAX_DELIVERIES,
)
from hookbus.services.process.offload import is_large, off_loop
from hookbus.skills import HookbusError, ServiceError
from hookbus.skills.errors import (
    Cancelled,
    DeadlineExceeded,
    DuplicateCompletionId,
    as_hookbus_error,
)
from hookbus.skills.lifecycle import Lifecycle
from hookbus.skills.outcome import Outcome
from hookbus.skills.runner import HookOutcome

log = structlog.get_logger("hookbus.orchestrator")

RESERVED_METADATA = frozenset({"completion_id", "model", "agent_name"})
SHUTDOWN_WAIT = 30.0
DRAIN_SECONDS = 60.0
"""How long a stopping orchestrator lets the requests it runs finish."""
OBSERVATIONS_WAIT = 2.0
"""How long a request's ack waits for its observation entries to be stored (Redis slow or away)."""
RECENTLY_OWNED = 0.25
"""How recent a response write that found the run's epoch current answers `still_owner`
(at most a quarter of `claim_idle`)."""
_CID = re.compile(rb'"completion_id"\s*:\s*"([^"\\]{1,200})"')
_SERVING: weakref.WeakKeyDictionary[Agent, int] = weakref.WeakKeyDictionary()
"""Services of this process running each agent. Services that share an agent share its LLM
client, so only the last one to stop closes it: closing it under another would cut that
one's calls in flight."""


class _StageNotingRuntime(BusRuntime):
    """The bus runtime, also telling the service which stage each request reached (for
    its journal; written with the next lease renewal, not on the request's path)."""

    on_stage: Callable[[str, Lifecycle], None] | None = None
    owner_check: Callable[[str], Awaitable[bool]] | None = None
    stopped_by: Callable[[str], HookbusError | None] | None = None

    def record_stage(
        self, completion_id: str, lifecycle: Lifecycle, group: str | None,
        outcomes: Sequence[HookOutcome], duration_ms: float,
    ) -> None:
        super().record_stage(completion_id, lifecycle, group, outcomes, duration_ms)
        if self.on_stage is not None:
            self.on_stage(completion_id, lifecycle)

    async def still_owner(self, ctx: Any) -> bool:
        """Asked by the agent right before finalize_connection (see OrchestratorService.still_owner)."""
        return True if self.owner_check is None else await self.owner_check(ctx.completion_id)

    def stop_error(self, ctx: Any) -> HookbusError | None:
        """Asked by the agent when its run is cancelled: the error this service stopped it
        with, if the service did (hookbus.services.orchestrator.run_table.RunTable.lose)."""
        return None if self.stopped_by is None else self.stopped_by(ctx.completion_id)


class OrchestratorService(BusApp):
    def __init__(
        self,
        agent: Agent,
        redis_url: str,
        *,
        prefix: str = "hookbus:",
        concurrency: int = ORCHESTRATOR_CONCURRENCY,
        instance: str | None = None,
        claim_idle: float = ORCHESTRATOR_CLAIM_IDLE,
        max_deliveries: int = ORCHESTRATOR_MAX_DELIVERIES,
        limits: RequestLimits | None = None,
        trim_every: float = TRIM_EVERY,
        observe_bound: BacklogBound | None = None,
        backlog_every: float = CHECK_EVERY,
    ) -> None:
        """`observe_bound`: what each observer group's stream may hold (default: the
        settings' HOOKBUS_OBSERVE_MAX_ENTRIES and HOOKBUS_OBSERVE_MAX_BYTES), checked every
        `backlog_every` seconds."""
        self.agent = agent
        self.redis_url = redis_url
        super().__init__(redis_url, graceful_timeout=DRAIN_SECONDS)
        self.keys = keys_for(redis_url, prefix)
        self.instance = instance or instance_name("orchestrator")
        self.concurrency = concurrency
        self.claim_idle = claim_idle
        self.max_deliveries = max_deliveries
        self.limits = limits or RequestLimits()
        self.trim_every = trim_every
        settings = get_settings()
        self.observe_bound = observe_bound or BacklogBound(
            max_entries=settings.observe_max_entries, max_bytes=settings.observe_max_bytes
        )
        self.backlog_every = backlog_every
        self.observations_dropped = 0
        """Observations this process's checks dropped (each group's total is in Redis)."""
        self._client: aredis.Redis | None = None
        self.runtime: BusRuntime | None = None
        self.journal: Journal | None = None
        self.steps: StepLog | None = None
        self.recovery = Recovery(self)
        self._tasks: list[asyncio.Task[Any]] = []
        self.runs = RunTable()
        self.served = 0
        self.fenced = 0
        self.refused = 0
        self._serving = False
        self._handlers: set[asyncio.Task[None]] = set()
        """Entries read: up to `concurrency` running, as many again waiting (prefetched)."""
        self._run_slots: asyncio.Semaphore | None = None
        self._reader: ShardedGroupReader | None = None

    def declare_subscriber(self) -> None:
        """Declare `requests` as this app's subscriber for the AsyncAPI document. A
        serving orchestrator does not call this: it reads every requests shard with its
        own loops (hookbus.bus.groups.shard_reader); FastStream runs the app's lifecycle."""

        @self.broker.subscriber(
            stream=StreamSub(
                self.keys.request_streams[0],
                group=ORCHESTRATOR_GROUP,
                consumer=self.instance,
                max_records=self.concurrency,
                polling_interval=1000,
            ),
            ack_policy=AckPolicy.MANUAL,
            parser=raw_entry_parser,
            max_workers=self.concurrency,
            title="requests",
            description="Agent requests (RequestEnvelope); answers go to responses:{completion_id}.",
        )
        async def on_request(msg: RedisStreamMessage) -> None:
            entry_id = text(msg.raw_message["message_ids"][0])
            await self.process(self.keys.request_streams[0], entry_id, msg.raw_message["data"])

    # ---------------------------------------------------------------- lifecycle

    @property
    def client(self) -> aredis.Redis:
        assert self._client is not None, "the service is not started"
        return self._client

    async def _before_startup(self) -> None:
        client = await self.broker.connect()
        for stream in self.keys.request_streams:
            await ensure_group(client, stream, ORCHESTRATOR_GROUP)

    async def _after_startup(self) -> None:
        client = self._client = await self.broker.connect()
        router = ReplyRouter(
            client, connect(self.redis_url, retries=0), self.keys.replies(self.instance),
            dead_letter=self.keys.dead_letter,
        )
        registry = RegistryView(client, self.keys)
        events = EventWriter(client, self.keys)
        runtime = _StageNotingRuntime(
            self.keys, router, registry, SessionStore(client, self.keys), events,
            instance=self.instance, send_on=get_settings().send_on,
        )
        runtime.on_stage = self.runs.note_stage
        runtime.owner_check = self.still_owner
        runtime.stopped_by = self.runs.stop_error
        self.runtime = runtime
        self.journal = Journal(client, self.keys)
        self.steps = StepLog(client, self.keys)
        await router.start()
        await registry.start()
        await events.start()
        runtime.pins.start()
        self.agent.runtime = self.runtime
        if self.agent.llm.http is None:
            # this service closes the agent's client on its own loop at shutdown, which an
            # aiohttp session needs (hookbus.services.orchestrator.llm: why aiohttp)
            self.agent.llm.http = "aiohttp"
        _SERVING[self.agent] = _SERVING.get(self.agent, 0) + 1
        self._serving = True
        await client.zadd(self.keys.orchestrators, {self.instance: time.time()})
        self.recovery.start()
        self._tasks = [
            asyncio.create_task(self._cancel_listener(), name="hookbus-cancel"),
            asyncio.create_task(
                repeat(self.backlog_every, self.bound_observer_backlogs, what="observer_backlog"),
                name="hookbus-observer-backlog",
            ),
        ]
        self._run_slots = asyncio.Semaphore(self.concurrency)
        self._reader = ShardedGroupReader(
            self.redis_url, self.keys.request_streams, ORCHESTRATOR_GROUP, self.instance,
            free=lambda: 2 * self.concurrency - len(self._handlers), deliver=self._deliver,
        )
        self._reader.start()
        log.info(
            "orchestrator_started", instance=self.instance, agent=self.agent.name,
            groups=list(registry.groups), claim_idle=self.claim_idle,
        )

    async def bound_observer_backlogs(self) -> dict[str, ObserverDrops]:
        """One check of every announced observer group's stream: what it dropped, by group."""
        assert self.runtime is not None
        announced = self.runtime.registry.announced
        groups = [name for name, group in announced.items() if any(h.observe for h in group.hooks)]
        dropped = await bound_observer_backlogs(self.client, self.keys, groups, self.observe_bound)
        self.observations_dropped += sum(d.entries for d in dropped.values())
        return dropped

    async def _on_shutdown(self) -> None:
        """Take no more requests (read or claimed), let the ones running finish."""
        await self.recovery.stop_claiming()
        reader, self._reader = self._reader, None
        if reader is not None:
            await reader.stop()
        if self._handlers:
            await asyncio.wait(set(self._handlers), timeout=DRAIN_SECONDS)

    def _deliver(self, stream: str, entry_id: str, fields: dict[bytes, bytes]) -> None:
        task = asyncio.create_task(self._handle(stream, entry_id, fields), name=f"request-entry-{entry_id}")
        self._handlers.add(task)
        task.add_done_callback(self._handler_done)

    def _handler_done(self, task: asyncio.Task[None]) -> None:
        self._handlers.discard(task)
        if self._reader is not None:
            self._reader.wake()

    async def _handle(self, stream: str, entry_id: str, fields: dict[bytes, bytes]) -> None:
        try:
            assert self._run_slots is not None
            async with self._run_slots:
                await self.process(stream, entry_id, fields)
        except Exception:  # noqa: BLE001 - the entry stays pending; it is claimed back later
            log.exception("request_handler_failed", entry_id=entry_id, stream=stream)

    async def _after_shutdown(self) -> None:
        """After the broker drained its in-flight requests: stop everything else."""
        await self.recovery.wait_recoveries(SHUTDOWN_WAIT)
        await self.recovery.stop()
        await cancel_and_wait(*self._tasks)
        self._tasks = []
        await self.agent.observers_idle(SHUTDOWN_WAIT)  # in-process observers see what they were handed
        if self.runtime is not None:
            await self.runtime.observations_flushed(SHUTDOWN_WAIT)
            await self.runtime.router.stop()
            await self.runtime.pins.stop()
            await self.runtime.registry.stop()
            await self.runtime.events.stop()
        if self._serving:
            self._serving = False
            _SERVING[self.agent] -= 1
            if not _SERVING[self.agent]:
                await self.agent.aclose()
        if self._client is not None:
            with contextlib.suppress(*RECONNECT_ERRORS):
                await self._client.zrem(self.keys.orchestrators, self.instance)
        log.info("orchestrator_stopped", instance=self.instance, served=self.served)

    # ------------------------------------------------------------ one request

    async def process(self, stream: str, entry_id: str, fields: dict[bytes, bytes]) -> None:
        """A request entry delivered to this orchestrator for the first time."""
        request = await self.admit(stream, entry_id, fields)
        if request is None:
            return
        run = self.runs.register(stream, entry_id, request.completion_id)
        try:
            assert self.journal is not None
            assert self.runtime is not None
            pins = self.runtime.pins.choose_all()
            try:
                begun = await self.journal.begin(
                    request.completion_id, entry_id, self.instance, now=time.time(), fields=pins
                )
            except (*RECONNECT_ERRORS, ResponseError) as exc:
                if not retryable(exc):  # unreachable, or out of memory: try again later
                    raise
                # Left pending: this process claims it back after a while (hookbus.bus.groups.claims).
                log.error("request_not_started", completion_id=request.completion_id, error=str(exc))
                return
            if not begun.ok:
                await self._not_ours(stream, entry_id, fields, request, begun)
                return
            run.epoch = begun.epoch
            self.runtime.pins.adopt(request.completion_id, pins)
            if begun.cancelled:
                run.cancel_reason = "cancelled before it started"
            await self.execute(run, request, RunMode.RUN)
        finally:
            self.runs.unregister(run)

    async def admit(self, stream: str, entry_id: str, fields: dict[bytes, bytes]) -> RequestEnvelope | None:
        """The request, or None when it was refused (dead-lettered, acked, and the client
        told with a 413 or 400 if its completion id could be read). A request on another
        shard than its completion id's is refused too: its journal scripts would span two
        slots (HookbusClient always queues on the right one)."""
        raw = fields.get(FIELD)
        if raw is not None:
            limits = self.limits.for_envelope()
            try:
                await off_loop(is_large(size=len(raw)), _check_limits, raw, limits)
            except LimitExceeded as refused:
                await self.refuse(stream, entry_id, fields, _peek_completion_id(raw, parse=False), refused)
                return None
            except InvalidJSON:
                pass  # decode says why, below
        try:
            request = await off_loop(is_large(size=len(raw or b"")), decode, fields, RequestEnvelope)
        except DecodeError as exc:
            error = ServiceError(400, "invalid_request", f"the request could not be read: {exc}")
            await self.refuse(stream, entry_id, fields, _peek_completion_id(raw), error)
            return None
        if self.keys.requests_for(request.completion_id) != stream:
            error = ServiceError(
                400, "misrouted_request",
                f"queued on {stream}, but its completion id belongs to {self.keys.requests_for(request.completion_id)}",
            )
            await self.refuse(stream, entry_id, fields, request.completion_id, error)
            return None
        return request

    async def refuse(
        self, stream: str, entry_id: str, fields: dict[bytes, bytes], completion_id: str | None, error: HookbusError
    ) -> None:
        def set_aside(pipe: Any) -> None:
            add_dead_letter(
                pipe, self.keys.dead_letter, source=stream, entry_id=entry_id,
                reason=f"{error.status_code} {error.code}: {error.message}", fields=fields,
                consumer=self.instance,
            )
            if completion_id:
                responses = self.keys.responses(completion_id)
                item = ResponseItem(kind="error", completion_id=completion_id, error=error.to_dict())
                pipe.xadd(responses, encode(item))
                pipe.expire(responses, RESPONSE_TTL)

        await in_order(
            self.client, set_aside, lambda pipe: pipe.xack(stream, ORCHESTRATOR_GROUP, entry_id)
        )
        self.refused += 1
        log.warning(
            "bad_request_dead_lettered", entry_id=entry_id, completion_id=completion_id,
            status=error.status_code, reason=error.message,
        )

    async def _not_ours(
        self, stream: str, entry_id: str, fields: dict[bytes, bytes], request: RequestEnvelope, begun: Begun
    ) -> None:
        cid = request.completion_id
        if begun.entry == entry_id:
            # Another orchestrator claimed it while it waited in our prefetch buffer.
            log.info("request_taken_over", completion_id=cid, owner=begun.owner)
            return
        error = DuplicateCompletionId(cid)
        if begun.done:  # the first one is over: its client is gone, tell this one
            await self.refuse(stream, entry_id, fields, cid, error)
        else:  # the first one still runs: do not disturb its response stream
            await self.refuse(stream, entry_id, fields, None, error)

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
        assert self.runtime is not None
        try:
            with self.agent.serving_on(self.runtime):
                return await self._execute(run, request, mode, first_seq=first_seq, error=error, resume=resume)
        finally:  # fenced: its new owner runs it on and releases it
            self.runtime.pins.release(request.completion_id, ended=not run.fenced)

    async def _execute(
        self, run: Running, request: RequestEnvelope, mode: RunMode, *, first_seq: int,
        error: HookbusError | None, resume: Resumption | None,
    ) -> bool:
        assert self.journal is not None and self.steps is not None and self.runtime is not None
        cid = request.completion_id
        fence = Fence(self.journal, cid, run.epoch, steps=list(resume.fields) if resume is not None else [])
        writer = ResponseWriter(
            self.client, self.keys.responses(cid),
            fence=fence,
            on_fenced=lambda: self.runs.fence_out(run),
            on_lost=lambda: self.runs.lose(run),
            first_seq=first_seq,
        )
        run.writer = writer
        if run.cancel_reason is not None and mode == RunMode.RUN:
            mode, error = RunMode.CANCELLED, Cancelled(f"the request was {run.cancel_reason}")
        if mode.runs:  # so that a running request shows its model and caller (the console)
            self.runtime.events.emit(
                MonitorRecord(
                    completion_id=cid, lifecycle=REQUEST_START, replica=self.instance,
                    model=self.agent.model, caller=request.auth.peer_user_id,
                )
            )
        steps = RunSteps(
            resume.records if resume is not None else (), functools.partial(self._record_step, fence),
            epoch=run.epoch, by=self.instance, resumed=resume is not None,
            role_sent=resume is not None and resume.sent.role,
        )
        task = asyncio.create_task(
            self._produce(request, writer, mode, error), name=f"request-{cid}",
            context=_with_run(run, steps),  # its hooks' tasks see which run they belong to
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
            self.fenced += 1
            log.warning("request_fenced_out", completion_id=cid, epoch=run.epoch)
            return False
        if task.cancelled():
            reason = run.cancel_reason or "cancelled"
            terminal = ResponseItem(
                kind="error", completion_id=cid,
                error=(run.stop_error or Cancelled(f"the request was {reason}")).to_dict(),
            )
        else:
            terminal = task.result()
        await self.runtime.observations_stored(cid, OBSERVATIONS_WAIT)
        try:
            stored = await writer.finish(
                terminal, ack=Ack(run.stream, ORCHESTRATOR_GROUP, run.entry_id)
            )
        except RECONNECT_ERRORS as exc:
            await writer.close()
            log.error("request_left_pending", completion_id=cid, error=str(exc))
            return False
        if not stored:
            self.fenced += 1
            log.warning("request_fenced_out", completion_id=cid, epoch=run.epoch)
            return False
        if run.stop_error is not None and run.stop_error.code == CLIENT_STALLED:
            # its client stopped reading and the gateway gave up on it: nobody reads this stream
            with contextlib.suppress(*RECONNECT_ERRORS):
                await self.client.delete(writer.stream)
        self.served += 1
        failure = terminal.error or {}
        if terminal.kind == "error":
            log.warning(
                "request_failed", completion_id=cid, status=failure.get("status_code"),
                error=failure.get("message"), console=request_link(cid),
            )
        self.runtime.events.emit(
            MonitorRecord(
                kind="request", completion_id=cid,
                lifecycle="request" if mode == RunMode.RUN else f"request:{mode}",
                replica=self.instance, duration_ms=(time.perf_counter() - run.started) * 1000,
                outcome=Outcome.OK if terminal.kind != "error" else Outcome.FAILED,
                error=failure.get("message"),
                model=self.agent.model, caller=request.auth.peer_user_id,
                status=int(failure.get("status_code", 500)) if terminal.kind == "error" else 200,
            )
        )
        return True

    async def still_owner(self, completion_id: str) -> bool:
        """Whether the run asking (the one whose task this is) may finalize its request:
        no, only when it knows it lost it (fenced out, or the journal's epoch is past its
        own: a peer claimed the request and runs its finalize). When in doubt, yes:
        finalize must run at least once, and every write after it is fenced anyway.

        A response write that found the epoch ours less than RECENTLY_OWNED seconds ago
        answers without asking Redis: a peer claims a request only after its owner's
        heartbeat was missing for `claim_idle`, or after it idled far longer, and a process
        that stalled since that write sees the time gone by."""
        run = _current_run.get()
        if run is None or run.completion_id != completion_id or not run.epoch:
            return True
        if run.fenced:
            return False
        owned_at = run.writer.owned_at if run.writer is not None else None
        if owned_at is not None and time.monotonic() - owned_at < min(RECENTLY_OWNED, self.claim_idle / 4):
            return True
        try:
            epoch = await self.client.hget(self.keys.journal(completion_id), "epoch")
        except RECONNECT_ERRORS:
            return True
        if epoch is not None and int(epoch) > run.epoch:
            self.runs.fence_out(run)
            return False
        return True

    async def _record_step(self, fence: Fence, n: int, record: StepRecord) -> bool:
        """One step of a run on record (hookbus.services.orchestrator.loop.run_steps); False if
        it could not be (Redis unreachable or refusing, or an in-process hook left a value
        JSON cannot carry in `ctx.state`): the run goes on, and a takeover replays less."""
        assert self.steps is not None
        try:
            fence.steps.append(await self.steps.append(fence.completion_id, n, record))
        except (*RECONNECT_ERRORS, ResponseError, PydanticSerializationError) as exc:
            log.warning("step_not_recorded", completion_id=fence.completion_id, step=record.key, error=str(exc))
            return False
        return True

    async def resumption(self, request: RequestEnvelope) -> Resumption | None:
        """Where a lost orchestrator left a request it had started, to run on from; None
        when it cannot go on unnoticed: a stream whose client already got text (a new LLM
        call would not continue that text, and the client must not get it twice)."""
        assert self.steps is not None
        found = await self.steps.resumption(request.completion_id)
        if request.stream and (found.sent.text or streamed_text(found.records)):
            return None
        return found

    async def _produce(
        self, request: RequestEnvelope, writer: ResponseWriter, mode: RunMode, error: HookbusError | None
    ) -> ResponseItem:
        """The run itself, in the request's span; returns the terminal item (never raises
        but for cancellation)."""
        with tracing.request_span(
            self.agent.name, request.completion_id, request.trace, mode, session_id=request.session_id
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
                await self.agent.finalize_only(
                    request.messages, completion_id=cid, error=error, auth=request.auth,
                    session_id=request.session_id, metadata=self._metadata(request),
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

    def _metadata(self, request: RequestEnvelope) -> dict[str, Any]:
        return {k: v for k, v in request.metadata.items() if k not in RESERVED_METADATA}

    async def _run(self, request: RequestEnvelope, writer: ResponseWriter) -> ResponseItem:
        kwargs: dict[str, Any] = {
            "auth": request.auth,
            "session_id": request.session_id,
            "completion_id": request.completion_id,
            "metadata": self._metadata(request),
            "tools": request.tools,
            "model_settings": request.model_settings,
            "deadline": request.deadline,
        }
        cid = request.completion_id
        if not request.stream:
            completion = await self.agent.run(request.messages, **kwargs)
            return ResponseItem(kind="final", completion_id=cid, completion=completion.model_dump(mode="json"))

        def progress(line: str) -> None:
            writer.add(ResponseItem(kind="progress", completion_id=cid, progress=line))

        first_output = True
        async for chunk in self.agent.run_stream(request.messages, on_progress=progress, **kwargs):
            at_once = first_output and _carries_output(chunk)
            first_output = first_output and not at_once
            writer.add(
                ResponseItem(kind="chunk", completion_id=cid, chunk=chunk.model_dump(mode="json", exclude_none=True)),
                at_once=at_once,
            )
        return ResponseItem(kind="done", completion_id=cid)

    async def _cancel_listener(self) -> None:
        """Cancel signals published by gateways; missed ones are caught by the marker
        check at the start of a run and at each lease renewal."""
        backoff = 0.1
        reader = connect(self.redis_url, retries=0)
        try:
            while True:
                pubsub: Any = None
                try:
                    await ready(reader)  # on a cluster: the node serving the channel's slot
                    pubsub = reader.pubsub()
                    await pubsub.subscribe(self.keys.cancel_channel)
                    backoff = 0.1
                    while True:
                        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                        if message and message.get("type") == "message":
                            cid = text(message["data"])
                            # why, from the marker (one read, on a rare path): a stalled client's
                            # run is finalized with that code
                            why = await self.client.get(self.keys.cancel(cid))
                            self.runs.cancel(cid, stalled=why is not None and text(why) == CLIENT_STALLED)
                except RECONNECT_ERRORS as exc:
                    log.warning("cancel_listener_reconnecting", error=str(exc), retry_in=backoff)
                    await forget_topology(reader)  # that node may be gone (failover)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                finally:
                    if pubsub is not None:
                        with contextlib.suppress(Exception):
                            await pubsub.aclose()
        finally:
            with contextlib.suppress(Exception):
                await reader.aclose()


_current_run: contextvars.ContextVar[Running | None] = contextvars.ContextVar("hookbus_run", default=None)


def _with_run(run: Running, steps: RunSteps) -> contextvars.Context:
    context = contextvars.copy_context()
    context.run(_current_run.set, run)
    context.run(RUN_STEPS.set, steps)
    return context


def _check_limits(raw: bytes, limits: RequestLimits) -> None:
    check_document(parse_json(raw, limits), limits)


def _carries_output(chunk: ChatCompletionChunk) -> bool:
    """Whether the chunk holds text or a tool call (not only a role or a finish reason):
    the answer's first such chunk is written without the response writer's linger."""
    return any(choice.delta.content or choice.delta.tool_calls for choice in chunk.choices)


def _peek_completion_id(raw: bytes | None, *, parse: bool = True) -> str | None:
    """The completion id of an unreadable request, if it can be found (to answer it)."""
    if not raw:
        return None
    match = _CID.search(raw[:4096])
    if match:
        return match.group(1).decode(errors="replace")
    if not parse:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    cid = value.get("completion_id") if isinstance(value, dict) else None
    return cid if isinstance(cid, str) and 0 < len(cid) <= 200 else None
