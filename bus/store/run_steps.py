"""A run's completed steps, kept so that a sibling that claims the request from a dead
owner continues the run instead of failing it (docs/operations.md: "An orchestrator dies").

Each step the run completes (one stage's hooks, one LLM call, one tool call) is a field
of the request's journal (hookbus.bus.store.journal): `step:{n}:{epoch}` holds the n-th
step (from 0) as its owner with that fencing epoch recorded it, a `StepRecord` as JSON.
Its owner writes an LLM call's or a tool call's field as soon as the call ends, and the
stages' fields waiting since the last write in one HSET before the next call (or
finalize) starts: what costs money or has effects outside is on record before anything
that follows it, and the stages between two calls cost one command together
(hookbus.services.orchestrator.loop.run_steps). Nothing else: the journal's TTL, renewed
with the lease, is the steps' too, and `finish` blanks the fields in the HSET it runs
anyway (the field names the writer hands it); the cost bench's budget
(hookbus.bus.store.journal, "Cost") has no room for a command a step.

Fencing: an owner that stalled and lost the request may still write steps after its
successor did; the epoch in the field's name keeps them apart (neither overwrites the
other), and `replayable` takes, for each n, the record of the highest epoch, and stops at
a record whose epoch is below one taken before it: the successor's steps stand, the
stalled owner's later ones are ignored, and so are those of an owner whose run took
another path than the record (hookbus.services.orchestrator.run_steps).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aredis
from pydantic import BaseModel
from redis.typing import EncodableT, FieldT

from hookbus.bus.connection.values import text
from hookbus.bus.keys import Keys
from hookbus.bus.wire.envelopes import DecodeError, response_items

STEP_FIELD = "step:"
"""The journal fields of steps: `step:{n}:{epoch}`."""


def step_field(n: int, epoch: int) -> str:
    return f"{STEP_FIELD}{n}:{epoch}"


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


def replayable(journal: Mapping[str, str]) -> list[StepRecord]:
    """The steps of a journal's fields that a new owner may go on from, in order (module
    docstring: the highest epoch of each step, up to one whose epoch is below one taken
    before it; a record that cannot be read ends them too)."""
    by_step: dict[int, dict[int, str]] = {}
    for name, value in journal.items():
        if name.startswith(STEP_FIELD) and value:
            n, _, owner = name.removeprefix(STEP_FIELD).partition(":")
            if n.isdigit() and owner.isdigit():
                by_step.setdefault(int(n), {})[int(owner)] = value
    records: list[StepRecord] = []
    newest = 0
    while (versions := by_step.get(len(records))) is not None:
        epoch = max(versions)
        if epoch < newest:
            break
        try:
            records.append(StepRecord.model_validate_json(versions[epoch]))
        except ValueError:
            break
        newest = epoch
    return records


class StepLog:
    """The steps of requests, in their journals, through one client and key layout."""

    def __init__(self, client: aredis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    async def append(self, completion_id: str, steps: Sequence[tuple[int, StepRecord]]) -> list[str]:
        """Put steps on record, each under its number n (one HSET); returns their fields,
        for `finish` to blank."""
        names = [step_field(n, record.epoch) for n, record in steps]
        fields: dict[FieldT, EncodableT] = {
            name: record.model_dump_json(exclude_none=True) for name, (_, record) in zip(names, steps, strict=True)
        }
        await self.client.hset(self.keys.journal(completion_id), mapping=fields)
        return names

    async def resumption(self, completion_id: str) -> Resumption:
        """What a request's lost owner left: its steps, and what its client was sent."""
        raw = await self.client.hgetall(self.keys.journal(completion_id))
        journal = {text(k): text(v) for k, v in raw.items()}
        return Resumption(
            replayable(journal),
            await stream_sent(self.client, self.keys.responses(completion_id)),
            [name for name in journal if name.startswith(STEP_FIELD)],
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
    fields: list[str]
    """Every step field of the journal (blanked when the request ends)."""
