"""A "split" hop wire format, to measure against hookbus.bus.envelopes' single-field one.

Today a hop entry is `{e: HopEvent JSON}` where `data` and `ctx` are dicts inside the
envelope: the orchestrator dumps HookData to a dict (model_dump) and the envelope dumps
that dict again to JSON; the worker parses the whole envelope into dicts and validates
the dicts again into HookData and Context; the reply goes the same way back.

Split: the stage data and the context travel as their own entry fields, each dumped
once straight from its model to JSON and validated once straight from JSON into its
model; the envelope (`e`) keeps only the small routing fields. A reply carries `d` only
when the hooks changed the data (the worker compares its dump with the bytes it got),
so a no-op hook costs no data on the way back and no validation on the orchestrator.

    e: {"v":1,"kind":"hop","hop_id":..., "hooks":[...], "reply_to":..., "ctx":{}}   (envelope)
    c: Context JSON
    d: HookData JSON
"""

from __future__ import annotations

import time
from typing import Any

from hookbus.bus.envelopes import FIELD, HookRef, HookTiming, HopEvent, HopReply
from hookbus.skills import Context, HookData
from hookbus.skills.runner import run_hooks

DATA = b"d"
CTX = b"c"


def encode_hop(
    *,
    hop_id: str,
    completion_id: str,
    lifecycle: str,
    stage_key: str,
    hooks: list[HookRef],
    data: HookData,
    ctx: Context,
    reply_to: str,
    deadline: float,
    epoch: int = 0,
) -> dict[bytes, bytes]:
    """The orchestrator's side: a small envelope, data and context dumped once each.

    (Validated construction on purpose: `model_construct` measured 2-3x slower than
    `HopEvent(...)` for these small models with pydantic 2.14.)"""
    event = HopEvent(
        hop_id=hop_id, completion_id=completion_id, lifecycle=lifecycle, stage_key=stage_key,
        hooks=hooks, ctx={}, reply_to=reply_to, deadline=deadline, epoch=epoch,
    )
    return {
        FIELD: event.model_dump_json(exclude_none=True).encode(),
        CTX: ctx.model_dump_json().encode(),
        DATA: data.model_dump_json().encode(),
    }


async def answer_split(host: Any, event: HopEvent, fields: dict[bytes, bytes], attempt: int, replica: str) -> dict[bytes, bytes]:
    """GroupHost.answer for a split entry (hooks only): returns the reply's fields."""
    started = time.perf_counter()
    reply = HopReply(hop_id=event.hop_id, completion_id=event.completion_id, replica=replica)
    out: dict[bytes, bytes] = {}
    try:
        ctx = Context.model_validate_json(fields[CTX])
        bound = []
        for ref in event.hooks:
            hook = host.hooks.get(ref.key)
            if hook is None:
                raise LookupError(f"group {host.group!r} has no hook {ref.key!r}")
            bound.append(hook)
        raw = fields.get(DATA)
        data = HookData.model_validate_json(raw) if raw else HookData(lifecycle=event.lifecycle)
        result = await run_hooks(bound, data, ctx, stage_key=event.stage_key, attempt=attempt)
        dumped = result.data.model_dump_json().encode()
        if dumped != raw:
            out[DATA] = dumped
        reply.abort = result.abort.to_dict() if result.abort is not None else None
        reply.blocked = result.blocked
        reply.outcomes = [
            HookTiming(hook=o.hook, duration_ms=o.duration_ms, outcome=o.outcome, error=o.error)
            for o in result.outcomes
        ]
        reply.state = ctx.state
        reply.session = ctx.session.data
    except (LookupError, ValueError) as exc:
        reply.failure = str(exc)
    reply.duration_ms = (time.perf_counter() - started) * 1000
    out[FIELD] = reply.model_dump_json(exclude_none=True).encode()
    return out
