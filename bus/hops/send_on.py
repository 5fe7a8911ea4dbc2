"""A stage sent on from one worker group to the next (a route).

A stage whose consecutive segments live in several worker groups used to cost a round
trip through the orchestrator per segment: orchestrator -> A -> orchestrator -> B ->
orchestrator. With a route, the hop to A lists the segments after it
(`HopEvent.route`), and A's worker, once its hooks let the stage go on (the runner's
`stage_goes_on`, the orchestrator's own rule), sends the next hop itself, in the same
pipeline as its reply and before it: orchestrator -> A -> B -> orchestrator. A still
replies (its reply names the hop it sent on, `HopReply.forwarded`), so the orchestrator
applies and records every segment as before, and a group that then fails or hangs costs
only its own hooks: the segments before it keep their changes.

A worker sends the stage on only while the orchestrator still waits for its own reply
(before the hop's deadline, which the orchestrator's wait outlasts by its grace); past
it, or when the orchestrator could not use the reply (a reply in the wrong shape), the
orchestrator sends the next hop itself and the one sent on, if any, is answered late and
its reply dropped, as a hop answered after its caller gave up always was. The hop sent
on carries the data and the context exactly as the orchestrator would have sent them:
the context as it came, with the hooks' `state` and session data (what a reply carries),
not whatever else a hook changed in its copy.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from pydantic_core import to_json

from hookbus.bus.wire.envelopes import HopEvent, HopReply, encode_hop
from hookbus.skills.lifecycle import Lifecycle
from hookbus.skills.runner import stage_goes_on


@dataclass(frozen=True, slots=True)
class Onward:
    """The next hop of a route, encoded: where it goes and its entry."""

    stream: str
    hop_id: str
    fields: dict[Any, Any]


def send_on(event: HopEvent, reply: HopReply, split: tuple[bytes, bytes | None] | None) -> Onward | None:
    """The next hop of `event`'s route after `reply`, or None when the stage does not go
    on from here (no route, a failed hop, an abort or a block, a batched on_chunk hop,
    the deadline passed, or state that JSON cannot carry: the reply then fails too)."""
    if not event.route or split is None or event.chunks or reply.failure:
        return None
    if not stage_goes_on(Lifecycle(event.lifecycle), reply.abort is not None, reply.blocked):
        return None
    now = time.time()
    if now >= event.deadline:
        return None
    step, rest = event.route[0], event.route[1:]
    ctx = json.loads(split[0])
    ctx["state"] = reply.state
    ctx.setdefault("session", {})["data"] = reply.session
    try:
        ctx_json = to_json(ctx)
    except ValueError:
        return None
    data_json = reply.data_json if reply.data_json is not None else (split[1] or b"")
    onward = HopEvent(
        hop_id=step.hop_id, completion_id=event.completion_id, lifecycle=event.lifecycle,
        stage_key=event.stage_key, hooks=step.hooks, ctx={}, reply_to=event.reply_to,
        deadline=now + step.timeout, epoch=event.epoch, route=rest or None,
    )
    return Onward(step.stream, step.hop_id, encode_hop(onward, data_json, ctx_json))
