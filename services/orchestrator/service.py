"""The orchestrator service: consumes `requests` in group `orchestrators` and runs the agent.

Any number of instances share the queue. Each request's chunks, final completion or
error go to `responses:{completion_id}`; the request is acked only after
finalize_connection ran and the terminal item is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import redis.asyncio as aredis
import structlog
from faststream import FastStream
from faststream.middlewares import AckPolicy
from faststream.redis import RedisBroker, RedisStreamMessage, StreamSub

from bus.connection import RECONNECT_ERRORS, connect, ensure_group, instance_name
from bus.deadletter import add_dead_letter, entry_id_text
from bus.envelopes import DecodeError, MonitorRecord, RequestEnvelope, ResponseItem, decode
from bus.events import EventWriter
from bus.keys import ORCHESTRATOR_GROUP, Keys
from bus.registry import HEARTBEAT_EVERY, RegistryView
from bus.responses import ResponseWriter
from bus.router import ReplyRouter
from bus.sessions import SessionStore
from services.orchestrator.agent import Agent
from services.orchestrator.bus_runtime import BusRuntime
from skills import HookError
from skills.errors import as_hook_error

log = structlog.get_logger("hookbus.orchestrator")

RESERVED_METADATA = frozenset({"completion_id", "model", "agent_name"})


class OrchestratorService:
    def __init__(
        self,
        agent: Agent,
        redis_url: str,
        *,
        prefix: str = "hookbus:",
        concurrency: int = 64,
        instance: str | None = None,
    ) -> None:
        self.agent = agent
        self.redis_url = redis_url
        self.keys = Keys(prefix)
        self.instance = instance or instance_name("orchestrator")
        self.concurrency = concurrency
        self.broker = RedisBroker(
            redis_url,
            graceful_timeout=60.0,
            logger=logging.getLogger("faststream.hookbus"),
            log_level=logging.DEBUG,
        )
        self.app = FastStream(
            self.broker,
            on_startup=[self._before_startup],
            after_startup=[self._after_startup],
            on_shutdown=[self._on_shutdown],
        )
        self._client: aredis.Redis | None = None
        self.runtime: BusRuntime | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self.served = 0
        self._subscribe()

    def _subscribe(self) -> None:
        @self.broker.subscriber(
            stream=StreamSub(
                self.keys.requests,
                group=ORCHESTRATOR_GROUP,
                consumer=self.instance,
                max_records=self.concurrency,
                polling_interval=1000,
            ),
            ack_policy=AckPolicy.MANUAL,
            max_workers=self.concurrency,
            title="requests",
            description="Agent requests (RequestEnvelope); answers go to responses:{completion_id}.",
        )
        async def on_request(msg: RedisStreamMessage) -> None:
            entry_id = entry_id_text(msg.raw_message["message_ids"][0])
            await self.process(entry_id, msg.raw_message["data"])

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        await self._before_startup()
        await self.broker.start()
        await self._after_startup()

    async def stop(self) -> None:
        await self.broker.stop()
        await self._on_shutdown()

    async def _before_startup(self) -> None:
        await ensure_group(await self.broker.connect(), self.keys.requests, ORCHESTRATOR_GROUP)

    async def _after_startup(self) -> None:
        client = self._client = await self.broker.connect()
        router = ReplyRouter(client, connect(self.redis_url, retries=0), self.keys.replies(self.instance))
        registry = RegistryView(client, self.keys)
        events = EventWriter(client, self.keys.events)
        self.runtime = BusRuntime(
            self.keys, router, registry, SessionStore(client, self.keys), events,
            instance=self.instance,
        )
        await router.start()
        await registry.start()
        await events.start()
        self.agent.runtime = self.runtime
        await client.zadd(self.keys.orchestrators, {self.instance: time.time()})
        self._tasks = [asyncio.create_task(self._heartbeat_loop(), name="hookbus-heartbeat")]
        log.info("orchestrator_started", instance=self.instance, agent=self.agent.name, groups=list(registry.groups))

    async def _on_shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self.runtime is not None:
            await self.runtime.router.stop()
            await self.runtime.registry.stop()
            await self.runtime.events.stop()
        if self._client is not None:
            with contextlib.suppress(*RECONNECT_ERRORS):
                await self._client.zrem(self.keys.orchestrators, self.instance)
        log.info("orchestrator_stopped", instance=self.instance, served=self.served)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_EVERY)
            try:
                assert self._client is not None
                await self._client.zadd(self.keys.orchestrators, {self.instance: time.time()})
            except RECONNECT_ERRORS as exc:
                log.warning("heartbeat_failed", error=str(exc))

    # ------------------------------------------------------------ one request

    async def process(self, entry_id: str, fields: dict[bytes, bytes]) -> None:
        client = self._client
        assert client is not None
        try:
            request = decode(fields, RequestEnvelope)
        except DecodeError as exc:
            async with client.pipeline(transaction=False) as pipe:
                add_dead_letter(
                    pipe, self.keys.dead_letter, source=self.keys.requests, entry_id=entry_id,
                    reason=str(exc), fields=fields, consumer=self.instance,
                )
                pipe.xack(self.keys.requests, ORCHESTRATOR_GROUP, entry_id)
                await pipe.execute()
            log.warning("bad_request_dead_lettered", entry_id=entry_id, reason=str(exc))
            return
        await self.serve(request)
        await client.xack(self.keys.requests, ORCHESTRATOR_GROUP, entry_id)
        self.served += 1

    async def serve(self, request: RequestEnvelope) -> None:
        """Run the agent for one request and write its response stream to the end."""
        assert self._client is not None and self.runtime is not None
        writer = ResponseWriter(self._client, self.keys.responses(request.completion_id))
        started = time.perf_counter()
        terminal: ResponseItem
        try:
            terminal = await self._run_until_deadline(request, writer)
        except HookError as exc:
            terminal = ResponseItem(kind="error", completion_id=request.completion_id, error=exc.to_dict())
        except Exception as exc:  # noqa: BLE001 - the client must get an answer whatever broke
            log.exception("request_crashed", completion_id=request.completion_id)
            terminal = ResponseItem(
                kind="error", completion_id=request.completion_id, error=as_hook_error(exc).to_dict()
            )
        await writer.finish(terminal)
        self.runtime.events.emit(
            MonitorRecord(
                kind="request", completion_id=request.completion_id, lifecycle="request",
                replica=self.instance, duration_ms=(time.perf_counter() - started) * 1000,
                outcome="ok" if terminal.kind != "error" else "error",
                error=(terminal.error or {}).get("message"),
            )
        )

    async def _run_until_deadline(self, request: RequestEnvelope, writer: ResponseWriter) -> ResponseItem:
        remaining = None if request.deadline is None else request.deadline - time.time()
        try:
            async with asyncio.timeout(remaining):
                return await self._run(request, writer)
        except TimeoutError as exc:
            raise HookError(504, "deadline_exceeded", "the request did not finish before its deadline") from exc

    async def _run(self, request: RequestEnvelope, writer: ResponseWriter) -> ResponseItem:
        metadata = {k: v for k, v in request.metadata.items() if k not in RESERVED_METADATA}
        kwargs: dict[str, Any] = {
            "auth": request.auth,
            "session_id": request.session_id,
            "completion_id": request.completion_id,
            "metadata": metadata,
        }
        cid = request.completion_id
        if not request.stream:
            completion = await self.agent.run(request.messages, **kwargs)
            return ResponseItem(kind="final", completion_id=cid, completion=completion.model_dump(mode="json"))
        async for chunk in self.agent.run_stream(request.messages, **kwargs):
            writer.add(ResponseItem(kind="chunk", completion_id=cid, chunk=chunk.model_dump(mode="json", exclude_none=True)))
        return ResponseItem(kind="done", completion_id=cid)
