"""Orchestrator crash recovery: claiming requests a lost orchestrator left pending,
renewing the lease on the requests this one runs, and the `requests` janitor.

The loops are the ones every consumer-group member runs (hookbus.bus.groups.member, shared
with the worker replicas); the heartbeat and the lease renewal run on the member's
liveness thread (bus/groups/liveness.py) instead of the event loop. What an orchestrator does in
them:

- **heartbeat**: its instance's score in `orchestrators` is the time of its last beat.

- **claims** (every `claim_idle / 2` s): pending `requests` entries whose orchestrator is
  dead (no heartbeat for `claim_idle` s), or idle far too long, are claimed (see
  bus/groups/claims.py). For each, the journal decides (bus/store/journal.py `claim`, which bumps
  the fencing epoch):
  - `fresh`: nobody started it (it sat in the dead one's prefetch buffer): run it;
  - `claimed`: it had started: the run goes on from the last step its journal records
    (hookbus.bus.store.run_steps; finished LLM calls, tool calls and stages are not run
    again, a tool call that had started runs again with its own idempotency key), with
    `ctx.recovery = True`; its answer is stored and the entry acked as any run's. A
    stream whose client already got text cannot go on unnoticed: for it, only
    finalize_connection runs, with `data.error` a 503 `orchestrator_lost`, then that
    error is stored as the terminal item (unless one is stored already) and the entry
    acked, in one fenced step;
  - `done`: it was finished and acked already: nothing to do but ack;
  - `duplicate`: another entry owns that completion id: dead-letter it.
  An entry delivered more than `max_deliveries` times (it keeps killing orchestrators)
  gets a 500 `request_failed` terminal item without another finalize, and a dead letter.
- **leases** (every `claim_idle / 3` s, on the liveness thread, bus/groups/liveness.py): one
  script renews the claim of every request this process runs (XCLAIM JUSTID) if the
  journal's epoch is still ours, refreshes their journals' TTL and stage, and reports
  those fenced out (stopped at once), those with a cancel marker (cancelled), and those
  whose journal is gone (Redis lost its data: ended at once with a 503
  `request_state_lost`, finalized here, since no other orchestrator knows of them).
- **janitor** (every `trim_every` s): trims `requests` up to what was acked, deletes the
  reply streams of orchestrators gone for long and forgets them (bus/groups/trim.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, Protocol

import redis
import redis.asyncio as aredis
import structlog

from hookbus.bus.connection.retrying import RECONNECT_ERRORS
from hookbus.bus.connection.values import text
from hookbus.bus.groups.claims import Claimed, OrphanRules
from hookbus.bus.groups.dead_letters import add_dead_letter
from hookbus.bus.groups.member import GroupMember, OnThread
from hookbus.bus.groups.served_agents import forget_stale
from hookbus.bus.groups.trim import FORGET_AFTER, prune_consumers, trim_acked
from hookbus.bus.keys import ORCHESTRATOR_GROUP, Keys
from hookbus.bus.store.journal import Journal, Lease, Leases
from hookbus.bus.store.run_steps import Resumption
from hookbus.bus.wire.envelopes import RequestEnvelope
from hookbus.services.orchestrator.serving.run_mode import RunMode
from hookbus.services.orchestrator.serving.run_table import Running, RunTable
from hookbus.skills import DuplicateCompletionId, HookbusError, OrchestratorLost, ServiceError

log = structlog.get_logger("hookbus.recovery")


class RecoveryHost(Protocol):
    """What recovery needs of the orchestrator service: its settings, its run table, and
    the three steps of a request (admit, refuse, execute)."""

    redis_url: str
    keys: Keys
    instance: str
    concurrency: int
    claim_idle: float
    max_deliveries: int
    trim_every: float
    runs: RunTable
    journal: Journal | None
    streams: dict[str, str | None]
    """The requests stream shards it reads (the unnamed queue's, each of its agents')."""

    @property
    def client(self) -> aredis.Redis: ...

    def announce(self, pipe: Any) -> None: ...

    async def admit(self, stream: str, entry_id: str, fields: dict[bytes, bytes]) -> RequestEnvelope | None: ...

    async def refuse(
        self, stream: str, entry_id: str, fields: dict[bytes, bytes], completion_id: str | None, error: HookbusError
    ) -> None: ...

    async def execute(
        self,
        run: Running,
        request: RequestEnvelope,
        mode: RunMode,
        *,
        first_seq: int = 0,
        error: HookbusError | None = None,
        resume: Resumption | None = None,
    ) -> bool: ...

    async def resumption(self, request: RequestEnvelope) -> Resumption | None: ...


class Recovery:
    """The orchestrator as a member of group `orchestrators` (hookbus.bus.groups.member):
    its heartbeat, claims, leases and janitor, and what it does with a claimed request."""

    def __init__(self, service: RecoveryHost) -> None:
        self.service = service
        self._loop: asyncio.AbstractEventLoop | None = None
        keys = service.keys
        self.member = GroupMember(
            OrphanRules(
                keys.request_streams[0], ORCHESTRATOR_GROUP, service.instance, keys.orchestrators,
                service.claim_idle, count=max(100, service.concurrency * 4),
            ),
            client=lambda: service.client, concurrency=service.concurrency,
            trim_every=service.trim_every, busy=lambda: service.runs,
            tidy=self.janitor_once, take_over=self._take_over, streams=list(service.streams),
            on_thread=OnThread(
                service.redis_url, f"hookbus-liveness-{service.instance}", self.beat, self.renew_once
            ),
        )
        self.recovered = 0
        """Requests claimed after they started that ended with `orchestrator_lost`."""
        self.continued = 0
        """Requests claimed after they started that ran on from their journal."""
        self.resumed = 0
        """Requests claimed before they started, run from the start."""
        self.trimmed = 0

    @property
    def claimed(self) -> int:
        return self.member.claimed

    def start(self) -> None:
        """The claim and janitor loops on this event loop, the liveness thread beside it."""
        self._loop = asyncio.get_running_loop()
        self.member.start()

    async def stop_claiming(self) -> None:
        await self.member.stop("claim")

    async def wait_recoveries(self, timeout: float) -> None:
        await self.stop_claiming()
        await self.member.wait_taken(timeout)

    async def stop(self) -> None:
        await self.member.stop()

    # ------------------------------------------------------------------ claims

    def _take_over(self, entry: Claimed) -> Awaitable[None]:
        log.info(
            "request_claimed", entry_id=entry.entry_id, previous_owner=entry.previous_owner,
            attempt=entry.attempt,
        )
        return self.recover(entry)

    async def recover(self, entry: Claimed) -> None:
        service = self.service
        assert service.journal is not None
        request = await service.admit(entry.stream, entry.entry_id, entry.fields)
        if request is None:
            return
        cid = request.completion_id
        run = service.runs.register(entry.stream, entry.entry_id, cid)
        try:
            sent_at = time.monotonic()
            outcome = await service.journal.claim(cid, entry.entry_id, service.instance, now=time.time())
            if outcome.outcome == "duplicate":
                await service.refuse(entry.stream, entry.entry_id, entry.fields, None, DuplicateCompletionId(cid))
                return
            if outcome.outcome == "done":
                await service.client.xack(entry.stream, ORCHESTRATOR_GROUP, entry.entry_id)
                return
            run.epoch, run.owned_at = outcome.epoch, sent_at
            if entry.attempt > service.max_deliveries:
                await self._give_up(entry, request, run)
                return
            if outcome.outcome == "fresh":
                log.info("request_resumed", completion_id=cid, previous_owner=entry.previous_owner)
                if await service.execute(run, request, RunMode.RUN):
                    self.resumed += 1
                return
            resume = None if outcome.finalized else await service.resumption(request)
            if resume is not None:
                log.warning(
                    "request_resuming", completion_id=cid, previous_owner=entry.previous_owner,
                    stage=outcome.stage, epoch=outcome.epoch, steps=len(resume.records),
                )
                if await service.execute(
                    run, request, RunMode.RESUME, first_seq=resume.sent.items, resume=resume
                ):
                    self.continued += 1
                return
            mode = RunMode.END if outcome.finalized else RunMode.RECOVER
            log.warning(
                "request_recovering", completion_id=cid, previous_owner=entry.previous_owner,
                stage=outcome.stage, epoch=outcome.epoch, mode=mode,
            )
            if await service.execute(run, request, mode, first_seq=-1, error=OrchestratorLost()):
                self.recovered += 1
        except RECONNECT_ERRORS as exc:
            log.warning("recovery_failed", completion_id=cid, error=str(exc))
        finally:
            service.runs.unregister(run)

    async def _give_up(self, entry: Claimed, request: RequestEnvelope, run: Running) -> None:
        service = self.service
        error = ServiceError(
            500, "request_failed",
            f"the request was delivered {entry.attempt} times and never finished; it was set aside",
        )
        async with service.client.pipeline(transaction=False) as pipe:
            add_dead_letter(
                pipe, service.keys.dead_letter, source=entry.stream, entry_id=entry.entry_id,
                reason=f"delivered {entry.attempt} times without finishing", fields=entry.fields,
                consumer=service.instance,
            )
            await pipe.execute()
        log.error("request_given_up", completion_id=request.completion_id, attempt=entry.attempt)
        await service.execute(run, request, RunMode.END, first_seq=-1, error=error)

    # ------------------------------------------------------ heartbeat, leases

    def beat(self, client: redis.Redis) -> None:
        """On the liveness thread (bus/groups/liveness.py), so a busy loop is not taken for dead."""
        pipe = client.pipeline(transaction=False)
        self.service.announce(pipe)
        pipe.execute()

    def renew_once(self, client: redis.Redis) -> None:
        """On the liveness thread (bus/groups/liveness.py): a busy event loop does not stop it.
        What it finds (fenced out, cancelled) is handed to the loop."""
        service = self.service
        runs = [r for r in service.runs.running() if r.epoch and not r.fenced]
        if not runs:
            return
        leases = [Lease(r.entry_id, r.completion_id, r.epoch, r.stage, r.stream) for r in runs]
        renewal = Leases(client, service.keys).renew(ORCHESTRATOR_GROUP, service.instance, leases)
        if (renewal.fenced or renewal.cancelled or renewal.lost) and self._loop is not None:
            run_of = {id(lease): run for lease, run in zip(leases, runs, strict=True)}
            fenced, cancelled, lost = (
                [run_of[id(x)] for x in found] for found in (renewal.fenced, renewal.cancelled, renewal.lost)
            )
            stalled = {run_of[id(x)].completion_id for x in renewal.stalled}
            self._loop.call_soon_threadsafe(self._apply_renewal, fenced, cancelled, lost, stalled)

    def _apply_renewal(
        self, fenced: list[Running], cancelled: list[Running], lost: list[Running], stalled: set[str]
    ) -> None:
        for run in fenced:
            self.service.runs.fence_out(run)
        for run in cancelled:
            self.service.runs.cancel(run.completion_id, stalled=run.completion_id in stalled)
        for run in lost:
            self.service.runs.lose(run)

    # ----------------------------------------------------------------- janitor

    async def janitor_once(self, forget_after: float = FORGET_AFTER) -> int:
        service = self.service
        keys = service.keys
        client = service.client
        removed = 0
        for stream in service.streams:
            removed += (await trim_acked(client, stream))[0]
        self.trimmed += removed
        gone = await client.zrangebyscore(keys.orchestrators, "-inf", time.time() - forget_after)
        if gone:
            await client.delete(*(keys.replies(text(g)) for g in gone))
        await forget_stale(client, keys, forget_after)
        for stream in service.streams:
            await prune_consumers(
                client, stream, ORCHESTRATOR_GROUP, keys.orchestrators, forget_after=forget_after
            )
        return removed

