"""When a worker sends a stage on (hookbus.bus.hops.send_on.send_on), and what the next hop
carries: the data and context exactly as the orchestrator would have sent them."""

from __future__ import annotations

import json
import time

import pytest

from hookbus.bus.hops.send_on import send_on
from hookbus.bus.wire.envelopes import (
    HookRef,
    HopEvent,
    HopReply,
    RouteStep,
    decode,
    encode_hop,
    hop_parts,
)
from hookbus.skills import Context, HookData

DATA = HookData(lifecycle="on_connection", messages=[{"role": "user", "content": "hi"}])


def _hop(lifecycle: str = "on_connection", *, steps: int = 2, deadline_in: float = 5.0, chunks: int = 0):
    route = [
        RouteStep(group=f"g{n}", stream=f"hooks:g{n}", hop_id=f"h{n}", hooks=[HookRef(skill=f"s{n}", method="m")], timeout=2.5)
        for n in range(1, steps + 1)
    ]
    event = HopEvent(
        hop_id="h0", completion_id="c", lifecycle=lifecycle, stage_key=lifecycle,
        hooks=[HookRef(skill="s0", method="m")], ctx={}, reply_to="replies:o", deadline=time.time() + deadline_in,
        epoch=3, route=route or None, chunks=chunks,
    )
    ctx = Context(state={"before": 1})
    ctx.metadata.completion_id = "c"
    fields = encode_hop(event, DATA.model_dump_json().encode(), ctx.model_dump_json().encode())
    decoded = decode(fields, HopEvent)
    return decoded, hop_parts(decoded, fields)


def _reply(**fields) -> HopReply:
    return HopReply(hop_id="h0", completion_id="c", replica="r", v=2, **fields)


def test_the_next_hop_carries_the_route_on_with_the_hooks_state_and_the_data_as_it_came():
    event, split = _hop()
    onward = send_on(event, _reply(state={"after": 2}, session={"s": 1}), split)
    assert onward is not None and (onward.stream, onward.hop_id) == ("hooks:g1", "h1")
    sent = decode(onward.fields, HopEvent)
    ctx_json, data_json = hop_parts(sent, onward.fields) or (b"", None)
    assert (sent.hop_id, sent.reply_to, sent.epoch, sent.stage_key) == ("h1", "replies:o", 3, "on_connection")
    assert [h.key for h in sent.hooks] == ["s1.m"]
    assert [s.hop_id for s in sent.route or []] == ["h2"]  # the rest of the route
    assert 2.0 < sent.deadline - time.time() <= 2.5  # the step's timeout, from now
    ctx = Context.model_validate_json(ctx_json)
    assert (ctx.state, ctx.session.data, ctx.completion_id) == ({"after": 2}, {"s": 1}, "c")
    assert data_json == DATA.model_dump_json().encode()  # unchanged: the bytes as they came


def test_changed_data_goes_on_as_the_hooks_left_it_and_the_last_step_has_no_route():
    event, split = _hop(steps=1)
    changed = HookData(lifecycle="on_connection", messages=[{"role": "user", "content": "changed"}])
    onward = send_on(event, _reply(data_json=changed.model_dump_json().encode()), split)
    assert onward is not None
    sent = decode(onward.fields, HopEvent)
    assert sent.route is None
    assert json.loads(onward.fields[b"d"])["messages"][0]["content"] == "changed"


@pytest.mark.parametrize(
    ("lifecycle", "reply", "goes_on"),
    [
        ("on_connection", {"abort": {"status_code": 402, "code": "x", "message": "m"}}, False),
        ("finalize_connection", {"abort": {"status_code": 500, "code": "x", "message": "m"}}, True),
        ("before_toolcall", {"blocked": True}, False),
        ("on_connection", {"failure": "the hooks' results are not JSON"}, False),
        ("on_connection", {"state": {"handle": object()}}, False),
    ],
)
def test_the_stage_goes_on_only_where_the_orchestrator_would_go_on(lifecycle, reply, goes_on):
    event, split = _hop(lifecycle)
    assert (send_on(event, _reply(**reply), split) is not None) is goes_on


def test_nothing_is_sent_on_past_the_deadline_without_a_route_or_for_a_chunk_batch():
    assert send_on(*_with_reply(_hop(deadline_in=-0.01))) is None
    assert send_on(*_with_reply(_hop(steps=0))) is None
    assert send_on(*_with_reply(_hop("on_chunk", chunks=2))) is None


def _with_reply(hop):
    event, split = hop
    return event, _reply(), split
