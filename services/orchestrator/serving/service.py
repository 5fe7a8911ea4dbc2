"""The orchestrator service: consumes `requests` in group `orchestrators` and runs the agent.

Any number of instances share the queue. Each request's chunks, final completion or
error go to `responses:{completion_id}`; the request is acked only after
finalize_connection ran and the terminal item is stored, in the same atomic step.

The service reads the entries and starts and stops everything; its parts live beside it:
admission.py (which entries run), execution.py (one run to its stored end and ack),
cancel_listener.py (the gateways' cancel signals) and recovery.py.

Reliability (see bus/store/journal.py and services/orchestrator/serving/recovery.py):

- a run starts by creating the request's journal (`begin`, one round trip that also
  reads the cancel marker); every response write and the final ack check the journal's
  epoch, so an owner that lost the request (it stalled and another orchestrator claimed
  it) stops without writing again;
- the requests it runs keep their claim (lease renewal every `claim_idle / 3` seconds),
  so a long LLM call is not taken away while this process is alive; heartbeats and lease
  renewal run on a thread of their own (bus/groups/liveness.py), so a busy event loop is not
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
- a janitor trims `requests` up to what was acked (bus/groups/trim.py), and every few seconds
  each observer group's stream is kept within its bound, what it drops counted
  (hookbus.bus.groups.observer_backlog).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio as aredis
import structlog
from faststream.middlewares import AckPolicy
from faststream.redis import RedisStreamMessage, StreamSub
from redis.exceptions import ResponseError

from hookbus.bus.connection.cluster import keys_for
from hookbus.bus.connection.retrying import (
    RECONNECT_ERRORS,
    connect,
    ensure_group,
    instance_name,
    raw_entry_parser,
    retryable,
)
from hookbus.bus.connection.values import text
from hookbus.bus.groups.observer_backlog import (
    CHECK_EVERY,
    BacklogBound,
    ObserverDrops,
    bound_observer_backlogs,
)
from hookbus.bus.groups.periodic import cancel_and_wait, repeat
from hookbus.bus.groups.registry import RegistryView
from hookbus.bus.groups.served_agents import AgentCard, check_agent_name, record_fields
from hookbus.bus.groups.shard_reader import ShardedGroupReader
from hookbus.bus.groups.trim import TRIM_EVERY
from hookbus.bus.hops.reply_router import ReplyRouter
from hookbus.bus.keys import ORCHESTRATOR_GROUP
from hookbus.bus.limits import RequestLimits
from hookbus.bus.settings import get_settings
from hookbus.bus.store.events import EventWriter
from hookbus.bus.store.journal import Journal
from hookbus.bus.store.run_steps import Resumption
from hookbus.bus.store.sessions import SessionStore
from hookbus.bus.wire.envelopes import RequestEnvelope
from hookbus.services.orchestrator.loop.agent import Agent
from hookbus.services.orchestrator.serving.admission import Admission
from hookbus.services.orchestrator.serving.bus_runtime import BusRuntime
from hookbus.services.orchestrator.serving.cancel_listener import listen_for_cancels
from hookbus.services.orchestrator.serving.execution import SHUTDOWN_WAIT, Execution
from hookbus.services.orchestrator.serving.recovery import Recovery
from hookbus.services.orchestrator.serving.run_mode import RunMode
from hookbus.services.orchestrator.serving.run_table import Running, RunTable
from hookbus.services.process.bus_app import BusApp
from hookbus.services.process.defaults import (
    ORCHESTRATOR_CLAIM_IDLE,
    ORCHESTRATOR_CONCURRENCY,
    ORCHESTRATOR_MAX_DELIVERIES,
)
from hookbus.skills import HookbusError
from hookbus.skills.lifecycle import Lifecycle
from hookbus.skills.runner import HookOutcome

log = structlog.get_logger("hookbus.orchestrator")

DRAIN_SECONDS = 60.0
"""How long a stopping orchestrator lets the requests it runs finish."""
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
        """Asked by the agent right before finalize_connection (Execution.still_owner)."""
        return True if self.owner_check is None else await self.owner_check(ctx.completion_id)

    def stop_error(self, ctx: Any) -> HookbusError | None:
        """Asked by the agent when its run is cancelled: the error this service stopped it
        with, if the service did (hookbus.services.orchestrator.serving.run_table.RunTable.lose)."""
        return None if self.stopped_by is None else self.stopped_by(ctx.completion_id)


class OrchestratorService(BusApp):
    """One orchestrator process's service: reads request entries, runs each admitted one on
    the agent and stores its answer. Its parts, each over this service's settings and run
    table: `admission` (which entries run), `execution` (one run to its stored end) and
    `recovery` (what lost orchestrators left, leases, the janitor)."""

    def __init__(
        self,
        agent: Agent | Sequence[Agent],
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
        `backlog_every` seconds.

        `agent`: the agent, or the agents, it serves, each under its name and from its own
        queue (`requests:<name>`); the first also runs the requests that name no agent
        (the plain `requests` queue, which every orchestrator reads)."""
        agents = [agent] if isinstance(agent, Agent) else list(agent)
        if not agents:
            raise ValueError("an orchestrator serves at least one agent")
        self.agents: dict[str, Agent] = {}
        for one in agents:
            if check_agent_name(one.name) in self.agents:
                raise ValueError(f"two agents named {one.name!r}: clients could not tell them apart")
            self.agents[one.name] = one
        self.agent = agents[0]
        """The agent a request that names none runs on."""
        self.redis_url = redis_url
        super().__init__(redis_url, graceful_timeout=DRAIN_SECONDS)
        self.keys = keys_for(redis_url, prefix)
        self.streams: dict[str, str | None] = dict.fromkeys(self.keys.request_streams)
        """Every requests stream shard it reads -> whose queue it is (None: the unnamed one)."""
        for name in self.agents:
            self.streams.update(dict.fromkeys(self.keys.agent_request_streams(name), name))
        self.cards = [AgentCard(name=a.name, models=list(a.models)) for a in agents]
        """What it announces beside each heartbeat (hookbus.bus.groups.served_agents)."""
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
        self.runs = RunTable()
        self.admission = Admission(self)
        self.execution = Execution(self)
        self.recovery = Recovery(self)
        self._tasks: list[asyncio.Task[Any]] = []
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
        for stream in self.streams:
            await ensure_group(client, stream, ORCHESTRATOR_GROUP)

    async def _after_startup(self) -> None:
        client = self._client = await self.broker.connect()
        runtime = await self._start_runtime(client)
        for agent in self.agents.values():
            agent.runtime = runtime
            if agent.llm.http is None:
                # this service closes the agent's client on its own loop at shutdown, which an
                # aiohttp session needs (hookbus.services.orchestrator.llm.client: why aiohttp)
                agent.llm.http = "aiohttp"
            _SERVING[agent] = _SERVING.get(agent, 0) + 1
        self._serving = True
        async with client.pipeline(transaction=False) as pipe:
            self.announce(pipe)
            await pipe.execute()
        self.recovery.start()
        self._tasks = [
            asyncio.create_task(
                listen_for_cancels(self.redis_url, self.keys, lambda: self.client, self.runs), name="hookbus-cancel"
            ),
            asyncio.create_task(
                repeat(self.backlog_every, self.bound_observer_backlogs, what="observer_backlog"),
                name="hookbus-observer-backlog",
            ),
        ]
        self._run_slots = asyncio.Semaphore(self.concurrency)
        self._reader = ShardedGroupReader(
            self.redis_url, list(self.streams), ORCHESTRATOR_GROUP, self.instance,
            free=lambda: 2 * self.concurrency - len(self._handlers), deliver=self._deliver,
        )
        self._reader.start()
        log.info(
            "orchestrator_started", instance=self.instance, agents=list(self.agents),
            groups=list(runtime.registry.groups), claim_idle=self.claim_idle,
        )

    async def _start_runtime(self, client: aredis.Redis) -> _StageNotingRuntime:
        """The runtime the agent runs on and the journal, built on `client` and started."""
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
        runtime.owner_check = self.execution.still_owner
        runtime.stopped_by = self.runs.stop_error
        self.runtime = runtime
        self.journal = Journal(client, self.keys)
        await router.start()
        await registry.start()
        await events.start()
        runtime.pins.start()
        return runtime

    def announce(self, pipe: Any) -> None:
        """Its heartbeat and the agents it serves, queued on `pipe` (sync or async): with
        every beat, so a Redis that lost its data learns them again within one."""
        pipe.zadd(self.keys.orchestrators, {self.instance: time.time()})
        pipe.hset(self.keys.orchestrator_agents, mapping=record_fields(self.instance, self.cards))

    def agent_for(self, request: RequestEnvelope) -> Agent:
        """The agent a request is for: the one it names, else the first this process serves."""
        return self.agents.get(request.agent or "", self.agent)

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
        for agent in self.agents.values():
            await agent.observers_idle(SHUTDOWN_WAIT)  # in-process observers see what they were handed
        if self.runtime is not None:
            await self.runtime.observations.flushed(SHUTDOWN_WAIT)
            await self.runtime.router.stop()
            await self.runtime.pins.stop()
            await self.runtime.registry.stop()
            await self.runtime.events.stop()
        if self._serving:
            self._serving = False
            for agent in self.agents.values():
                _SERVING[agent] -= 1
                if not _SERVING[agent]:
                    await agent.aclose()
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
            sent_at = time.monotonic()
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
                await self.admission.not_ours(stream, entry_id, fields, request, begun)
                return
            run.epoch, run.owned_at = begun.epoch, sent_at
            self.runtime.pins.adopt(request.completion_id, pins)
            if begun.cancelled:
                run.cancel_reason = "cancelled before it started"
            await self.execute(run, request, RunMode.RUN)
        finally:
            self.runs.unregister(run)

    async def admit(self, stream: str, entry_id: str, fields: dict[bytes, bytes]) -> RequestEnvelope | None:
        """`Admission.admit`, on the service for recovery (RecoveryHost) as for its own entries."""
        return await self.admission.admit(stream, entry_id, fields)

    async def refuse(
        self, stream: str, entry_id: str, fields: dict[bytes, bytes], completion_id: str | None, error: HookbusError
    ) -> None:
        """`Admission.refuse`, on the service for recovery (RecoveryHost) as for its own entries."""
        await self.admission.refuse(stream, entry_id, fields, completion_id, error)

    async def execute(
        self, run: Running, request: RequestEnvelope, mode: RunMode, *, first_seq: int = 0,
        error: HookbusError | None = None, resume: Resumption | None = None,
    ) -> bool:
        """`Execution.execute`, on the service for recovery (RecoveryHost) as for its own entries."""
        return await self.execution.execute(run, request, mode, first_seq=first_seq, error=error, resume=resume)

    async def resumption(self, request: RequestEnvelope) -> Resumption | None:
        """`Execution.resumption`, for recovery (RecoveryHost)."""
        return await self.execution.resumption(request)

    @property
    def served(self) -> int:
        """Requests this process ended and acked."""
        return self.execution.served

    @property
    def fenced(self) -> int:
        """Runs that stopped because another orchestrator took their request over."""
        return self.execution.fenced

    @property
    def refused(self) -> int:
        """Entries set aside without a run (unreadable, over the limits, misrouted, duplicates)."""
        return self.admission.refused
