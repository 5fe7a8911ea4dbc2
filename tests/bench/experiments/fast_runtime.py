"""The orchestrator side of a hop with the split wire format (experiments/codec.py):
a copy of BusRuntime.hop and of ReplyRouter with these changes only:

- the data and context are dumped once each, straight to JSON, into their own entry
  fields (the envelope stays small);
- the reply reader decodes only the small envelope; the waiting caller validates the
  data (`HookData.model_validate_json`) only when the reply carries `d`, i.e. when a
  hook changed it; otherwise the caller's own HookData object stands, as it does today
  for a reply without data;
- the HookRef list of a segment is built once per segment, not per hop.

Use with the lean worker (it answers a split entry in kind).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

import redis.asyncio as aredis
import structlog

from hookbus.bus.connection import RECONNECT_ERRORS
from hookbus.bus.envelopes import DecodeError, HookRef, HopReply, decode
from hookbus.bus.router import HopTimeout
from hookbus.services.orchestrator.bus_runtime import BusRuntime, failed_segment
from hookbus.services.orchestrator.plan import Segment
from hookbus.skills import Context, HookData
from hookbus.skills.errors import HookError
from hookbus.skills.runner import ChainResult, HookOutcome
from tests.bench.experiments.codec import DATA, encode_hop

log = structlog.get_logger("bench.fast_runtime")


class FastRouter:
    def __init__(self, client: aredis.Redis, reader: aredis.Redis, reply_stream: str) -> None:
        self._client = client
        self._reader_client = reader
        self.reply_stream = reply_stream
        self._waiting: dict[str, asyncio.Future[tuple[HopReply, bytes | None]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self) -> None:
        self._reader = asyncio.create_task(self._read_replies())

    async def stop(self) -> None:
        self._stopping = True
        with contextlib.suppress(*RECONNECT_ERRORS):
            await self._client.xadd(self.reply_stream, {"wake": "stop"})
        if self._reader is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._reader, 3)
        await self._reader_client.aclose()
        with contextlib.suppress(*RECONNECT_ERRORS):
            await self._client.delete(self.reply_stream)

    async def call_raw(self, stream: str, hop_id: str, fields: dict[bytes, bytes], timeout: float) -> tuple[HopReply, bytes | None]:
        future: asyncio.Future[tuple[HopReply, bytes | None]] = asyncio.get_running_loop().create_future()
        self._waiting[hop_id] = future
        try:
            await self._client.xadd(stream, fields)  # type: ignore[arg-type]
            return await asyncio.wait_for(future, timeout)
        except TimeoutError as exc:
            raise HopTimeout(f"no reply from {stream} within {timeout:g}s") from exc
        finally:
            self._waiting.pop(hop_id, None)

    async def _read_replies(self) -> None:
        last_id = "0-0"
        since_trim = 0
        while not self._stopping:
            response = await self._reader_client.xread({self.reply_stream: last_id}, count=1000, block=2000)
            for _stream, entries in response or ():
                for entry_id, fields in entries:
                    last_id = entry_id
                    since_trim += 1
                    if b"wake" in fields:
                        continue
                    try:
                        reply = decode(fields, HopReply)
                    except DecodeError:
                        continue
                    future = self._waiting.get(reply.hop_id)
                    if future is not None and not future.done():
                        future.set_result((reply, fields.get(DATA)))
            if since_trim >= 256:
                since_trim = 0
                with contextlib.suppress(*RECONNECT_ERRORS):
                    await self._reader_client.xtrim(self.reply_stream, minid=last_id)


async def fast_hop(self: BusRuntime, segment: Segment, data: HookData, ctx: Context, stage_key: str) -> ChainResult:
    """BusRuntime.hop over the split wire format; `self.fast_router` (else `self.router`)
    is a FastRouter."""
    router: FastRouter = getattr(self, "fast_router", None) or self.router  # type: ignore[assignment]
    group = segment.group
    assert group is not None
    if not self.registry.is_live(group):
        return failed_segment(segment, data, f"no live replica in worker group {group!r}", "skipped", no_worker=True)
    timeout = self._segment_timeout(segment)
    cache: dict[int, list[HookRef]] = self.__dict__.setdefault("_refs", {})
    refs = cache.get(id(segment))
    if refs is None:
        refs = cache[id(segment)] = [
            HookRef(skill=h.remote.skill, method=h.remote.method) for h in segment.hooks if h.remote
        ]
    hop_id = uuid.uuid4().hex
    fields = encode_hop(
        hop_id=hop_id, completion_id=ctx.completion_id, lifecycle=data.lifecycle, stage_key=stage_key,
        hooks=refs, data=data, ctx=ctx, reply_to=router.reply_stream,
        deadline=time.time() + timeout, epoch=self.epoch,
    )
    self.hops += 1
    try:
        reply, raw = await router.call_raw(self.keys.hooks(group), hop_id, fields, timeout)
    except HopTimeout as exc:
        return failed_segment(segment, data, str(exc), "timeout")
    if reply.failure:
        return failed_segment(segment, data, f"worker group {group!r}: {reply.failure}", "error")
    try:
        new_data = HookData.model_validate_json(raw) if raw is not None else data
        if new_data.lifecycle != data.lifecycle:
            raise ValueError(f"reply is for {new_data.lifecycle}, not {data.lifecycle}")
    except ValueError as exc:
        return failed_segment(segment, data, f"reply in the wrong shape: {exc}", "error")
    ctx.state = reply.state
    ctx.session.data = reply.session
    return ChainResult(
        new_data,
        [HookOutcome(o.hook, o.duration_ms, o.outcome, o.error) for o in reply.outcomes],  # type: ignore[arg-type]
        HookError.from_dict(reply.abort) if reply.abort else None,
        reply.blocked,
    )


class FastBusRuntime(BusRuntime):
    router: FastRouter  # type: ignore[assignment]
    hop = fast_hop  # type: ignore[assignment]


def patch_runtime(runtime: BusRuntime, redis_url: str) -> None:
    """Make a live BusRuntime (e.g. an OrchestratorService's) hop over the split format,
    with its own FastRouter on `<reply stream>:fast`, started on the first hop."""
    from hookbus.bus.connection import connect

    router = FastRouter(runtime.router._client, connect(redis_url, retries=0), runtime.router.reply_stream + ":fast")  # type: ignore[attr-defined]
    started = False

    async def hop(segment: Segment, data: HookData, ctx: Context, stage_key: str) -> ChainResult:
        nonlocal started
        if not started:
            started = True
            await router.start()
        return await fast_hop(runtime, segment, data, ctx, stage_key)

    runtime.fast_router = router  # type: ignore[attr-defined]
    runtime.hop = hop  # type: ignore[method-assign]


async def fast_bus_side(redis_url: str, prefix: str, instance: str | None = None) -> Any:
    """tests.bench.common.bus_side with FastBusRuntime + FastRouter."""
    from hookbus.bus.connection import connect
    from hookbus.bus.events import EventWriter
    from hookbus.bus.keys import Keys
    from hookbus.bus.registry import RegistryView
    from hookbus.bus.sessions import SessionStore
    from tests.bench.common import BusSide

    keys = Keys(prefix)
    instance = instance or f"bench-fast-{uuid.uuid4().hex[:6]}"
    client = connect(redis_url)
    router = FastRouter(client, connect(redis_url, retries=0), keys.replies(instance))
    registry = RegistryView(client, keys)
    events = EventWriter(client, keys.events)
    runtime = FastBusRuntime(keys, router, registry, SessionStore(client, keys), events, instance=instance)  # type: ignore[arg-type]
    await router.start()
    await registry.start()
    await events.start()
    return BusSide(runtime, client)
