"""A run's completed steps, kept so that a sibling that claims the request from a dead
owner continues the run instead of failing it (docs/operations.md: "An orchestrator dies").

`steps:{completion_id}` (hookbus.bus.keys.Keys.steps, in the slot of the request's
journal) is a string of lines, one `StepRecord` as JSON each, appended as the run
completes a step: one stage's hooks, one LLM call, one tool call. Its owner appends the
line before the next step starts, so whatever a step did is on record before anything
that follows it can happen. A string and APPEND: one command a step (the cost bench's
budget: hookbus.bus.store.journal, "Cost"), the lines in the order the steps ended, and
one key to delete at the end rather than field names to keep track of.

Fencing: each line carries its writer's epoch (hookbus.bus.store.journal). An owner that
stalled and lost the request may append after its successor did; `replayable` drops
every line whose epoch is below one read before it, so the successor's lines stand and
the stalled owner's later ones are ignored. A run that resumed from nothing (its
predecessor died before its first step ended) starts the key again with SET, which also
drops whatever a stalled predecessor appended after the claim.

Lifetime: JOURNAL_TTL from the first line, renewed with the lease (the journal's renewal
script), deleted with the terminal item by the journal's `finish`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aredis
from pydantic import BaseModel

from hookbus.bus.connection.values import text
from hookbus.bus.keys import Keys
from hookbus.bus.store.journal import JOURNAL_TTL
from hookbus.bus.wire.envelopes import DecodeError, response_items


class StepRecord(BaseModel):
    """One completed step of a run: what the loop needs to go on past it without running
    it again."""

    key: str
    """Which step, unique within the run and the same when the run is replayed:
    `on_connection`, `before_llm_call#0`, `llm_call#0`, `after_llm_call#0`,
    `before_toolcall#0:<call id>`, `tool#0:<call id>`, `after_toolcall#0:<call id>`, `on_message`."""
    epoch: int
    """The fencing epoch of the owner that ran it."""
    by: str = ""
    """The orchestrator instance that ran it (the takeover shows which ran which steps)."""
    output: dict[str, Any]
    """What the step produced (the stage's data, the LLM's answer, the tool's result)."""
    state: dict[str, Any] | None = None
    """`ctx.state` after the step, when the step changed it."""
    session: dict[str, Any] | None = None
    """`ctx.session.data` after the step, when the step changed it."""


def replayable(raw: bytes | str | None) -> list[StepRecord]:
    """The lines of a steps key that a new owner may go on from, in order: a line whose
    epoch is below one read before it is a stalled owner's, written after it lost the
    request (module docstring), and is dropped; so is a line that cannot be read (a write
    cut off by a crash leaves at most the last one so)."""
    records: list[StepRecord] = []
    newest = 0
    for line in text(raw or b"").splitlines():
        if not line:
            continue
        try:
            record = StepRecord.model_validate_json(line)
        except ValueError:
            continue
        if record.epoch < newest:
            continue
        newest = record.epoch
        records.append(record)
    return records


class StepLog:
    """The steps keys of requests, bound to one client and key layout."""

    def __init__(self, client: aredis.Redis, keys: Keys, *, ttl: int = JOURNAL_TTL) -> None:
        self.client = client
        self.keys = keys
        self.ttl = ttl

    async def append(self, completion_id: str, record: StepRecord, *, first: bool) -> None:
        """Put one step on record (one command). `first`: the run has no line yet (it
        started, or resumed from nothing): SET with the TTL rather than APPEND."""
        line = record.model_dump_json(exclude_none=True) + "\n"
        key = self.keys.steps(completion_id)
        if first:
            await self.client.set(key, line, ex=self.ttl)
        else:
            await self.client.append(key, line)

    async def read(self, completion_id: str) -> list[StepRecord]:
        return replayable(await self.client.get(self.keys.steps(completion_id)))

    async def resumption(self, completion_id: str) -> Resumption:
        """What a request's lost owner left: its steps, and what its client was sent."""
        return Resumption(
            await self.read(completion_id),
            await stream_sent(self.client, self.keys.responses(completion_id)),
        )


class StreamSent(BaseModel):
    """What a streamed request's client was sent before its owner died."""

    items: int = 0
    """Response items stored (the new owner's writer numbers its batches after them)."""
    text: bool = False
    """Whether any chunk carried text or a tool call: then the stream cannot go on
    without the client noticing (a new LLM call would not continue that text)."""
    role: bool = False
    """Whether the role delta went out (it is sent once a turn)."""


async def stream_sent(client: aredis.Redis, responses: str) -> StreamSent:
    """Read a response stream's stored items (on the recovery path only: one XRANGE)."""
    sent = StreamSent()
    entries: list[tuple[bytes, dict[bytes, bytes]]] = await client.xrange(responses)  # type: ignore[assignment]
    for entry_id, fields in entries:
        ms, _, seq = text(entry_id).partition("-")
        if ms == "0":
            sent.items = int(seq)
        try:
            items = response_items(fields)
        except DecodeError:
            continue
        for item in items:
            for choice in (item.chunk or {}).get("choices") or []:
                delta = choice.get("delta") or {}
                sent.role = sent.role or bool(delta.get("role"))
                sent.text = sent.text or bool(delta.get("content") or delta.get("tool_calls") or delta.get("refusal"))
    return sent


@dataclass(frozen=True)
class Resumption:
    """Where a request's lost owner left it: the steps it completed, what its client got."""

    records: list[StepRecord]
    sent: StreamSent
