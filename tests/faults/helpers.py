"""Small tools the fault tests share: a raw response reader that never deletes the
stream (so a second terminal item would be seen), polling, and counters."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aredis

from hookbus.bus.connection.retrying import connect
from hookbus.bus.groups.periodic import cancel_and_wait
from hookbus.bus.groups.versions import ReplicaInfo
from hookbus.bus.keys import ORCHESTRATOR_GROUP, Keys
from hookbus.bus.store.journal import Journal
from hookbus.bus.store.response_stream import TERMINAL_KINDS
from hookbus.bus.wire.envelopes import (
    DecodeError,
    RequestEnvelope,
    ResponseItem,
    encode,
    response_items,
)
from tests.faults.fault_skills import fault_key
from tests.integration.processes import Proc, Processes


@dataclass
class Outcome:
    completion_id: str
    items: list[ResponseItem] = field(default_factory=list)
    terminal_id: bytes | None = None
    ended: float | None = None

    @property
    def terminal(self) -> ResponseItem | None:
        return self.items[-1] if self.terminal_id is not None else None

    @property
    def error(self) -> dict[str, Any] | None:
        terminal = self.terminal
        return terminal.error if terminal is not None and terminal.kind == "error" else None

    @property
    def text(self) -> str:
        parts = []
        for item in self.items:
            if item.kind == "chunk" and item.chunk:
                for choice in item.chunk.get("choices", []):
                    parts.append((choice.get("delta") or {}).get("content") or "")
            elif item.kind == "final" and item.completion:
                parts.append(item.completion["choices"][0]["message"].get("content") or "")
        return "".join(parts)


async def submit(
    client: aredis.Redis,
    keys: Keys,
    text: str,
    *,
    completion_id: str,
    stream: bool = True,
    timeout: float = 60.0,
    session_id: str | None = None,
    trace: dict[str, str] | None = None,
) -> RequestEnvelope:
    request = RequestEnvelope(
        completion_id=completion_id,
        messages=[{"role": "user", "content": text}],
        stream=stream,
        session_id=session_id,
        deadline=time.time() + timeout,
        trace=trace,
    )
    await client.xadd(keys.requests, encode(request))  # type: ignore[arg-type]
    return request


async def read_until_terminal(
    client: aredis.Redis, keys: Keys, completion_id: str, timeout: float = 60.0
) -> Outcome:
    """Every item up to the first terminal one; the stream is left in place."""
    outcome = Outcome(completion_id)
    stream = keys.responses(completion_id)
    last: bytes | str = "0-0"
    deadline = time.monotonic() + timeout
    backoff = 0.05
    while time.monotonic() < deadline:
        try:
            response = await client.xread({stream: last}, count=500, block=500)
        except (ConnectionError, OSError, aredis.ConnectionError, aredis.TimeoutError):
            await asyncio.sleep(backoff)  # Redis is down (a restart test): retry, backing off
            backoff = min(backoff * 2, 1.0)
            continue
        for _name, entries in response or ():
            for entry_id, fields in entries:
                last = entry_id
                try:
                    batch = response_items(fields)
                except DecodeError:
                    continue
                for item in batch:
                    outcome.items.append(item)
                    if item.kind in TERMINAL_KINDS:
                        outcome.terminal_id = entry_id
                        outcome.ended = time.monotonic()
                        return outcome
    return outcome


async def stored_items(client: aredis.Redis, keys: Keys, completion_id: str) -> list[ResponseItem | None]:
    """Every item on the response stream in order, batches unpacked; None for an entry
    that cannot be decoded."""
    stored: list[ResponseItem | None] = []
    for _id, fields in await client.xrange(keys.responses(completion_id)):
        try:
            stored += response_items(fields)
        except DecodeError:
            stored.append(None)
    return stored


async def items_after_terminal(client: aredis.Redis, keys: Keys, outcome: Outcome) -> list[ResponseItem | None]:
    """What was written to the response stream after its first terminal item."""
    assert outcome.terminal_id is not None
    stored = await stored_items(client, keys, outcome.completion_id)
    first = next(i for i, item in enumerate(stored) if item is not None and item.kind in TERMINAL_KINDS)
    return stored[first + 1:]


async def terminal_count(client: aredis.Redis, keys: Keys, completion_id: str) -> int:
    stored = await stored_items(client, keys, completion_id)
    return sum(1 for item in stored if item is not None and item.kind in TERMINAL_KINDS)


async def finalize_log(client: aredis.Redis, prefix: str, completion_id: str, counter: str = "finalize") -> list[dict[str, Any]]:
    raw = await client.lrange(fault_key(f"{counter}-log", completion_id, prefix=prefix), 0, -1)
    return [json.loads(r) for r in raw]


async def runs(client: aredis.Redis, prefix: str, completion_id: str) -> list[dict[str, Any]]:
    raw = await client.lrange(fault_key("runs", completion_id, prefix=prefix), 0, -1)
    return [json.loads(r) for r in raw]


async def pending(client: aredis.Redis, stream: str, group: str) -> int:
    try:
        return int((await client.xpending(stream, group))["pending"])
    except aredis.ResponseError:
        return 0


async def version_stream(client: aredis.Redis, keys: Keys, group: str) -> str:
    """The hook stream of the one version `group`'s replicas announced (alive, or killed:
    a replica that left after a drain took its version with it): where an orchestrator
    sends the group's hops (hookbus.bus.groups.versions)."""
    infos = await client.hgetall(keys.replica_versions(group))
    [version] = {ReplicaInfo.model_validate_json(body).version for body in infos.values()}
    return keys.pinned_hooks_for(group, version, "")


@contextlib.asynccontextmanager
async def recording(redis_url: str, stream: str) -> AsyncIterator[list[dict[bytes, bytes]]]:
    """The entries added to `stream` while inside, each kept as it comes (a blocking read
    is served the moment an entry is added). For a stream its reader trims, as an
    orchestrator trims its replies a second after it last waited for one: reading it
    once the request ended finds nothing when that comes later, as on a loaded machine."""
    client = connect(redis_url, retries=0)
    entries: list[dict[bytes, bytes]] = []

    async def follow() -> None:
        last: bytes | str = "0-0"
        while True:
            for _name, found in await client.xread({stream: last}, count=100, block=1000) or ():
                for entry_id, fields in found:
                    last = entry_id
                    entries.append(fields)

    task = asyncio.ensure_future(follow())
    try:
        yield entries
    finally:
        await cancel_and_wait(task)
        await client.aclose()


async def taken_over(client: aredis.Redis, keys: Keys, completion_id: str, survivor: str, victim: str) -> dict[str, str]:
    """The journal of a request `survivor` took over from `victim` (epoch 2) and ended,
    checked: nothing left pending, one terminal item."""
    after = await Journal(client, keys).read(completion_id)
    assert after["owner"] == survivor and after["previous_owner"] == victim, after
    assert after["epoch"] == "2" and after["done"] == "1" and after["recovered"] == "1", after
    assert await pending(client, keys.requests, ORCHESTRATOR_GROUP) == 0
    assert await terminal_count(client, keys, completion_id) == 1
    return after


async def two_orchestrators(procs: Processes, agent: str, *extra: Proc) -> tuple[Proc, Proc]:
    """`orch-1` and `orch-2` serving `agent` (claim idle 1 s), ready with `extra`."""
    one = procs.orchestrator(agent, instance="orch-1", claim_idle=1)
    two = procs.orchestrator(agent, instance="orch-2", claim_idle=1)
    await procs.wait_ready(*extra, one, two)
    return one, two
