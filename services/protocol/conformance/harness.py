"""What the kit's checks reach (the client, the keys, the worker process) and what a check's
request gives them (`Run`): the requests go through the kit's orchestrator, and what each one
ended with is what its `Recorder` hook saw."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hookbus.bus.client import HookbusClient
from hookbus.bus.groups.registry import REPLICA_TTL, GroupAnnouncement
from hookbus.bus.keys import Keys
from hookbus.bus.wire.envelopes import DecodeError, MonitorRecord, monitor_records
from hookbus.services.orchestrator.serving import OrchestratorService
from hookbus.services.protocol.conformance.skills import GROUP, REFERENCE_GROUP, Recorder
from hookbus.services.protocol.conformance.worker_process import WorkerProcess
from hookbus.skills import HookError

WORKER_START_TIMEOUT = 90.0
"""Seconds the worker may take to announce its group and beat (npx may install first)."""


class CheckFailed(AssertionError):
    """A check's verdict: the worker does not do what the spec says; the message says why."""


Check = Callable[["Harness"], Awaitable[None]]


@dataclass
class Run:
    """One request of a check, as the client and the Recorder saw it."""

    completion_id: str
    text: str = ""
    chunks: list[str] = field(default_factory=list)
    error: HookError | None = None
    seconds: float = 0.0
    ended: dict[str, Any] = field(default_factory=dict)

    @property
    def state(self) -> dict[str, Any]:
        return dict(self.ended.get("state") or {})

    def seen(self, name: str, lifecycle: str) -> list[dict[str, Any]]:
        return list(self.state.get("seen", {}).get(name, {}).get(lifecycle, []))


class Harness:
    """What the checks reach: the client, the keys, the worker process."""

    def __init__(self, redis_url: str, prefix: str, worker: WorkerProcess) -> None:
        self.redis_url = redis_url
        self.keys = Keys(prefix)
        self.client = HookbusClient(redis_url, prefix=prefix, timeout=120)
        self.worker = worker
        self.runs: dict[str, Run] = {}
        """Requests that several checks read, by name (hookbus.services.protocol.conformance.checks._once)."""

    async def request(self, text: str, mode: str, *, stream: bool = True, session_id: str | None = None) -> Run:
        """Send one request in `mode` and wait until its `finalize_connection` was recorded."""
        run = Run(f"chatcmpl-conformance-{uuid.uuid4().hex}")
        metadata = {"conformance": mode, "conformance_token": uuid.uuid4().hex}
        options: dict[str, Any] = {"completion_id": run.completion_id, "metadata": metadata, "session_id": session_id}
        began = time.monotonic()
        try:
            if stream:
                async for chunk in self.client.stream(text, **options):
                    delta = chunk.choices[0].delta.content if chunk.choices else None
                    run.chunks.append(delta or "")
                run.text = "".join(run.chunks)
            else:
                completion = await self.client.complete(text, **options)
                run.text = completion.choices[0].message.content or ""
        except HookError as exc:
            run.error = exc
        run.seconds = time.monotonic() - began
        for _ in range(100):  # the Recorder runs before the terminal item; a moment at most
            if run.completion_id in Recorder.ended:
                break
            await asyncio.sleep(0.02)
        run.ended = Recorder.ended.pop(run.completion_id, {})
        run.ended.setdefault("state", {})
        run.ended["metadata"] = metadata
        return run

    async def worker_records(self, completion_id: str, lifecycle: str, *, within: float = 5.0) -> list[MonitorRecord]:
        """The hop records the worker under test wrote for a request at `lifecycle` (the
        events are flushed every 0.1 s: waited for up to `within` seconds)."""
        deadline = time.monotonic() + within
        while True:
            found: list[MonitorRecord] = []
            for stream in self.keys.event_streams:
                entries: Any = await self.client.redis.xrange(stream)
                for _, fields in entries:
                    try:
                        records = monitor_records(fields)
                    except DecodeError:
                        continue
                    found += [
                        r for r in records
                        if (r.completion_id, r.lifecycle, r.group, r.kind) == (completion_id, lifecycle, GROUP, "hop")
                    ]
            if found or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.1)

    async def live_replicas(self) -> list[str]:
        members = await self.client.redis.zrangebyscore(self.keys.replicas(GROUP), time.time() - REPLICA_TTL, "+inf")
        return [m.decode() if isinstance(m, bytes) else str(m) for m in members]

    async def wait_for_worker(self, other_than: Sequence[str] = ()) -> str:
        """The name of a live replica of the group (not one of `other_than`), once it announced."""
        deadline = time.monotonic() + WORKER_START_TIMEOUT
        while time.monotonic() < deadline:
            if self.worker.exited is not None:
                raise CheckFailed(f"the worker exited with status {self.worker.exited}:\n{self.worker.log_tail()}")
            announced = await self.client.redis.hget(self.keys.registry, GROUP)
            fresh = [r for r in await self.live_replicas() if r not in other_than]
            if announced and fresh:
                GroupAnnouncement.model_validate_json(announced)
                return fresh[0]
            await asyncio.sleep(0.1)
        raise CheckFailed(f"no replica of {GROUP!r} announced itself in {WORKER_START_TIMEOUT:g} s:\n{self.worker.log_tail()}")


async def until_served(orchestrator: OrchestratorService) -> None:
    """Until the orchestrator's registry view plans the two groups (it refreshes twice a second)."""
    assert orchestrator.runtime is not None
    registry = orchestrator.runtime.registry
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        await registry.refresh()
        if registry.is_live(GROUP) and registry.is_live(REFERENCE_GROUP):
            return
        await asyncio.sleep(0.1)
    refused = registry.refused.get(GROUP)
    raise CheckFailed(f"the orchestrator does not serve the group: {refused or 'it is not live in its view'}")
