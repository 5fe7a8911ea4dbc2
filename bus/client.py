"""HookbusClient: put a request on the queue and read its answer from its response stream.

    async with HookbusClient() as client:            # REDIS_URL from the environment
        async for chunk in client.stream("hello"):    # openai ChatCompletionChunk
            print(chunk.choices[0].delta.content or "", end="")
        completion = await client.complete("hello")   # openai ChatCompletion

    HookbusClient(agent="support")                    # requests for the agent named support

A client (or a request: `submit(..., agent=...)`) that names an agent queues on that
agent's own stream, which only the orchestrators serving it read; one that names none
queues on `requests`, as a deployment of one agent always did, and is refused (400
`agent_required`) while two or more agents are served, as any of them could get it. A name no orchestrator
serves now fails at once (404 `model_not_found`, or 503 `agent_unavailable` for an agent
whose orchestrators are all gone), and so does a wait whose agent lost its last
orchestrator (hookbus.bus.groups.served_agents: a cached view, read at most once a second).

A structured error is raised as the `HookbusError` subclass it was, with its status, code
and message: a hook's verdict (a 402 from a payment hook) as a `HookError`, anything else (a
Redis outage, an upstream failure) as a `ServiceError`; a request that outlives its deadline
raises a 504 `DeadlineExceeded` instead of hanging.

Through a Redis outage the client keeps trying until the request's deadline: sending
retries with backoff (then a 503 `bus_unavailable`), reading reconnects. A response stream
entry holds a batch of items (hookbus.bus.wire.envelopes.ResponseBatch) or, as writers before
batching wrote, one bare item: both are read. A stream read to its terminal item is
deleted off the request's path, with the others read within 0.2 s, in one DEL
(hookbus.bus.store.read_answers); `close` deletes those still waiting. An entry that cannot be decoded (a batch
with one bad item included) is copied to the dead-letter stream and skipped as a whole.

When Redis runs out of memory (`maxmemory`, policy noeviction) it refuses every XADD, so
the orchestrator cannot write the answer of a request already in flight. The waiting
client finds out for itself: whenever its read of the response stream comes back empty,
it asks Redis whether it would refuse a write next to that stream (a SETRANGE of nothing
on a key never written: no effect, but refused at maxmemory as XADD is). Refused on
`OOM_REFUSALS` empty reads in a row (2-4 s), it ends the request with a 503
`redis_out_of_memory` and publishes its cancel (PUBLISH is not refused at maxmemory), so
the orchestrator stops the run and finalize_connection runs with a 499, as on a
disconnect; the orchestrator stores that terminal item when memory returns
(hookbus.bus.store.response_stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import redis.asyncio as aredis
import structlog
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import ValidationError
from redis.exceptions import ResponseError

from hookbus.bus import run_state
from hookbus.bus.connection.cluster import keys_for, ready
from hookbus.bus.connection.retrying import RECONNECT_ERRORS, connect, out_of_memory
from hookbus.bus.connection.values import text
from hookbus.bus.groups.dead_letters import send_dead_letter
from hookbus.bus.groups.served_agents import AgentsView
from hookbus.bus.limits import RequestLimits
from hookbus.bus.settings import get_settings
from hookbus.bus.store.read_answers import ReadAnswers
from hookbus.bus.store.response_stream import TERMINAL_KINDS
from hookbus.bus.wire import tracecontext
from hookbus.bus.wire.envelopes import (
    DecodeError,
    RequestEnvelope,
    ResponseItem,
    encode,
    response_items,
)
from hookbus.skills import (
    AuthInfo,
    BusUnavailable,
    DeadlineExceeded,
    HookbusError,
    ModelSettings,
    RedisOutOfMemory,
    ServiceError,
)
from hookbus.skills.model_settings import as_model_settings

log = structlog.get_logger("hookbus.client")

DEFAULT_TIMEOUT = 300.0
OOM_REFUSALS = 2
"""Empty reads in a row (each waits up to 2 s) on which Redis refused writes for want of
memory before a waiting request gives up: a short spike at the limit is not its end."""
ANSWER_LOST_TO_OOM = (
    "Redis is out of memory (maxmemory reached, policy noeviction): the answer to this "
    "request cannot be written, so it was given up; free memory or raise maxmemory"
)


class HookbusClient:
    def __init__(
        self,
        redis_url: str | None = None,
        *,
        prefix: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        limits: RequestLimits | None = None,
        agent: str | None = None,
    ) -> None:
        settings = get_settings()
        url = redis_url or run_state.redis_url()
        if not url:
            raise ValueError(
                "no Redis to talk to: pass redis_url, set REDIS_URL, or start `hookbus run` "
                "in this folder"
            )
        self.keys = keys_for(url, prefix or settings.prefix)
        self.timeout = timeout
        self.max_request_bytes = (limits or RequestLimits()).for_envelope().max_request_bytes
        self._client = connect(url, max_connections=2000)
        self._reader = connect(url, max_connections=2000, retries=0)
        self.read_answers = ReadAnswers(self._client)
        """Deletes the response streams read to their end, several in one DEL."""
        self._ready = False
        self.agent = agent
        """The agent every request names unless it names its own."""
        self.agents = AgentsView(self._reader, self.keys)

    async def __aenter__(self) -> HookbusClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.read_answers.close()
        await self._client.aclose()
        await self._reader.aclose()

    @property
    def redis(self) -> aredis.Redis:
        return self._client

    async def _connected(self) -> None:
        """On a cluster, load the slot map once before concurrent use (hookbus.bus.connection.cluster.ready)."""
        if not self._ready:
            await ready(self._client)
            await ready(self._reader)
            self._ready = True

    # ------------------------------------------------------------------ sending

    async def submit(
        self,
        messages: Sequence[dict[str, Any]] | str,
        *,
        stream: bool = True,
        session_id: str | None = None,
        auth: AuthInfo | dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        completion_id: str | None = None,
        timeout: float | None = None,
        tools: list[dict[str, Any]] | None = None,
        model_settings: ModelSettings | dict[str, Any] | None = None,
        agent: str | None = None,
        model: str | None = None,
    ) -> RequestEnvelope:
        """Queue a request; returns its envelope (its `completion_id` names the response stream).

        `tools` are the caller's own (client) tools: a call to one ends the run and comes
        back as the completion's `tool_calls`. `model_settings` reach the LLM calls.
        `agent` (default: the client's) picks the agent; `model`, one of the models that
        agent allows for its LLM calls."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        agent = agent or self.agent
        try:
            await self._connected()
            served = await self.agents.served()
        except RECONNECT_ERRORS as exc:
            raise BusUnavailable(f"could not queue the request: {exc}") from exc
        if agent is not None:
            served.require(agent, model)
        elif len(served.live) > 1:  # every orchestrator reads `requests`: any agent could get it
            raise ServiceError(
                400, "agent_required",
                f"this deployment serves {len(served.live)} agents ({', '.join(served.live)}): name the one "
                "to ask (HookbusClient(agent=...), submit(agent=...), `hookbus send --agent NAME`)",
            )
        try:
            request = RequestEnvelope(
                completion_id=completion_id or f"chatcmpl-{uuid.uuid4().hex}",
                agent=agent,
                model=model,
                messages=list(messages),
                stream=stream,
                auth=auth if isinstance(auth, AuthInfo) else AuthInfo.model_validate(auth or {}),
                session_id=session_id,
                metadata=metadata or {},
                deadline=time.time() + (timeout or self.timeout),
                tools=tools,
                model_settings=as_model_settings(model_settings),
                trace=tracecontext.outgoing(),
            )
        except ValidationError as exc:
            raise ServiceError(400, "invalid_request", f"invalid request: {exc}") from exc
        fields = encode(request)
        size = len(fields[b"e"])
        if size > self.max_request_bytes:
            raise ServiceError(
                413, "request_too_large",
                f"request is {size} bytes; the limit is {self.max_request_bytes} bytes",
            )
        try:
            await self._connected()
            if completion_id is not None:
                await self.read_answers.reused(self.keys.responses(completion_id))
            await self._client.xadd(self.keys.requests_for(request.completion_id, agent), fields)  # type: ignore[arg-type]
        except RECONNECT_ERRORS as exc:
            raise BusUnavailable(f"could not queue the request: {exc}") from exc
        except ResponseError as exc:
            if out_of_memory(exc):
                raise RedisOutOfMemory() from exc
            raise
        tracecontext.tag_current_span("hookbus.completion_id", request.completion_id)
        return request

    # ------------------------------------------------------------------ reading

    async def items(self, request: RequestEnvelope) -> AsyncIterator[ResponseItem]:
        """Every response item of the request, up to and including the terminal one."""
        stream = self.keys.responses(request.completion_id)
        deadline = request.deadline or (time.time() + self.timeout)
        last_id: bytes | str = "0-0"
        backoff = 0.05
        refusals = 0
        while True:
            remaining = deadline - time.time()
            if remaining <= 0:
                raise DeadlineExceeded(f"no answer for {request.completion_id} before its deadline")
            try:
                await self._connected()
                response: Any = await self._reader.xread(
                    {stream: last_id}, count=500, block=max(1, int(min(remaining, 2.0) * 1000))
                )
                backoff = 0.05
                if not response:
                    await self._check_agent_served(request)
                if response or not await self._refusing_writes(request.completion_id):
                    refusals = 0
                else:
                    refusals += 1
                    if refusals >= OOM_REFUSALS:
                        await self._give_up(request.completion_id)
                        raise RedisOutOfMemory(ANSWER_LOST_TO_OOM)
            except RECONNECT_ERRORS as exc:
                log.warning("response_read_retry", completion_id=request.completion_id, error=str(exc))
                await asyncio.sleep(min(backoff, max(0.0, deadline - time.time())))
                backoff = min(backoff * 2, 1.0)
                continue
            for _stream, entries in response or ():
                for entry_id, fields in entries:
                    last_id = entry_id
                    try:
                        batch = response_items(fields)
                    except DecodeError as exc:
                        await self._skip_bad_item(stream, entry_id, fields, str(exc))
                        continue
                    for item in batch:
                        if item.kind in TERMINAL_KINDS:
                            # before yielding: a caller that stops at the terminal item (as
                            # complete() does) never resumes this generator
                            self.read_answers.read(stream)
                            yield item
                            return
                        yield item

    async def _refusing_writes(self, completion_id: str) -> bool:
        """Whether Redis refuses writes where this request's answer goes: SETRANGE of
        nothing on a key never written does nothing, but is refused at maxmemory. Any
        other refusal (an ACL without SETRANGE) counts as no: it must not end the read."""
        try:
            await self._reader.setrange(self.keys.memory_probe(completion_id), 0, "")
        except ResponseError as exc:
            return out_of_memory(exc)
        return False

    async def _check_agent_served(self, request: RequestEnvelope) -> None:
        """A request waiting for an agent none of whose orchestrators lives any more ends
        with that agent's 503 (its cancel published: an orchestrator started later skips it)."""
        if request.agent is None:
            return
        try:
            (await self.agents.served()).require(request.agent)
        except ServiceError as exc:
            if exc.status_code != 503:
                raise
            await self._give_up(request.completion_id, "agent_unavailable")
            raise

    async def _give_up(self, completion_id: str, why: str = "answer_lost_to_redis_out_of_memory") -> None:
        """Tell the orchestrator nobody waits for this answer any more (best effort)."""
        log.warning(why, completion_id=completion_id)
        with contextlib.suppress(*RECONNECT_ERRORS):
            await self._reader.publish(self.keys.cancel_channel, completion_id)

    async def _skip_bad_item(self, stream: str, entry_id: bytes | str, fields: dict[bytes, bytes], reason: str) -> None:
        log.warning("bad_response_item_skipped", stream=stream, reason=reason)
        with contextlib.suppress(*RECONNECT_ERRORS):
            await send_dead_letter(
                self._client, self.keys.dead_letter, source=stream, entry_id=text(entry_id),
                reason=reason, fields=fields, consumer="client",
            )

    async def stream(self, messages: Sequence[dict[str, Any]] | str, **options: Any) -> AsyncIterator[ChatCompletionChunk]:
        """Send a streaming request and yield its chunks as they come."""
        request = await self.submit(messages, stream=True, **options)
        async for item in self.items(request):
            if item.kind == "chunk" and item.chunk is not None:
                yield ChatCompletionChunk.model_validate(item.chunk)
            elif item.kind == "error":
                raise _error(item)

    async def complete(self, messages: Sequence[dict[str, Any]] | str, **options: Any) -> ChatCompletion:
        """Send a non-streaming request and return the final completion."""
        request = await self.submit(messages, stream=False, **options)
        async for item in self.items(request):
            if item.kind == "final" and item.completion is not None:
                return ChatCompletion.model_validate(item.completion)
            if item.kind == "error":
                raise _error(item)
        raise ServiceError(502, "bad_response", "the response stream ended without a completion")


def _error(item: ResponseItem) -> HookbusError:
    error = item.error or {"status_code": 500, "code": "unknown", "message": json.dumps(item.model_dump())}
    return HookbusError.from_dict(error)
