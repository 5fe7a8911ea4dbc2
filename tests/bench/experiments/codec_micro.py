"""CPU per hop of the envelope work alone (no Redis), today's wire format against the split
one (experiments/codec.py), for both realistic hops, and two things that look like
optimizations and are not.

- orchestrator encode: BusRuntime.hop's HopEvent(data=HookData.model_dump(mode="json"),
  ctx=Context.model_dump(mode="json")) + encode  vs  codec.encode_hop;
- worker: decode + GroupHost.answer (one no-op hook) + encode  vs  decode + answer_split;
- orchestrator decode + apply: decode(HopReply) + HookData.model_validate(reply.data)  vs
  decode of the small envelope (data unchanged: nothing to validate);
- `model_construct` against validated construction of the small envelopes;
- stdlib json against pydantic's Rust JSON on the hop's data.

    python -m tests.bench.experiments.codec_micro
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from tests.bench import payloads
from tests.bench.common import Row, atimeit_us, print_rows, timeit_us


async def measure() -> list[Row]:
    from hookbus.bus.envelopes import HookRef, HookTiming, HopEvent, HopReply, decode, encode
    from hookbus.services.worker.host import GroupHost
    from hookbus.skills import HookData
    from tests.bench.experiments.codec import DATA, answer_split, encode_hop
    from tests.bench.skills import HopNoop

    host = GroupHost("hop", [HopNoop()])
    rows: list[Row] = []
    print("\n[codec] CPU per hop of the envelope work, no Redis (best of 5)")
    for kind, make in payloads.KINDS.items():
        data, ctx = make(), payloads.context()
        refs = [HookRef(skill="hop-noop", method="chunk" if kind == "on_chunk" else "before")]

        def send_classic() -> dict[bytes, bytes]:
            return encode(HopEvent(  # noqa: B023
                hop_id=uuid.uuid4().hex, completion_id=ctx.completion_id, lifecycle=data.lifecycle,  # noqa: B023
                stage_key=kind, hooks=list(refs), data=data.model_dump(mode="json"),  # noqa: B023
                ctx=ctx.model_dump(mode="json"), reply_to="r", deadline=time.time() + 30,  # noqa: B023
            ))

        def send_split() -> dict[bytes, bytes]:
            return encode_hop(
                hop_id=uuid.uuid4().hex, completion_id=ctx.completion_id, lifecycle=data.lifecycle,  # noqa: B023
                stage_key=kind, hooks=refs, data=data, ctx=ctx, reply_to="r", deadline=time.time() + 30,  # noqa: B023
            )

        classic_event, split_event = send_classic(), send_split()

        async def worker_classic() -> dict[bytes, bytes]:
            return encode(await host.answer(decode(classic_event, HopEvent), 1, "r"))  # noqa: B023

        async def worker_split() -> dict[bytes, bytes]:
            return await answer_split(host, decode(split_event, HopEvent), split_event, 1, "r")  # noqa: B023

        classic_reply, split_reply = await worker_classic(), await worker_split()

        def receive_classic() -> HookData:
            return HookData.model_validate(decode(classic_reply, HopReply).data)  # noqa: B023

        def receive_split() -> HookData:
            decode(split_reply, HopReply)  # noqa: B023
            raw = split_reply.get(DATA)  # noqa: B023
            return HookData.model_validate_json(raw) if raw else data  # noqa: B023

        figures = {
            "orchestrator encode": (timeit_us(send_classic), timeit_us(send_split)),
            "worker decode+answer+encode": (await atimeit_us(worker_classic), await atimeit_us(worker_split)),
            "orchestrator decode+apply": (timeit_us(receive_classic), timeit_us(receive_split)),
        }
        sizes = (
            f"event {len(classic_event[b'e'])} -> {sum(map(len, split_event.values()))} B, "
            f"reply {len(classic_reply[b'e'])} -> {sum(map(len, split_reply.values()))} B"
        )
        print(f"  {kind}: {sizes}")
        for label, (today, split) in figures.items():
            print(f"    {label:<30} today {today:7.1f} us   split {split:7.1f} us")
            rows.append(Row("fixes", f"codec {kind}: {label}", split, "us", today, "today"))
        total_today = sum(t for t, _ in figures.values())
        total_split = sum(s for _, s in figures.values())
        rows.append(Row("fixes", f"codec {kind}: all envelope work per hop", total_split, "us", total_today, "today",
                        note=sizes))
        dumped = data.model_dump(mode="json")
        stdlib = timeit_us(lambda: json.dumps(dumped))  # noqa: B023
        rust = timeit_us(lambda: data.model_dump_json())  # noqa: B023
        print(f"    json.dumps(data dict) {stdlib:.1f} us vs HookData.model_dump_json {rust:.1f} us")

    kw = dict(hop_id="x" * 32, completion_id="c", replica="r")
    init = timeit_us(lambda: HopReply(**kw))
    construct = timeit_us(lambda: HopReply.model_construct(
        **kw, data=None, tool_result=None, state={}, session={}, abort=None, blocked=False, outcomes=[],
        failure=None, duration_ms=0.0,
    ))
    timing = timeit_us(lambda: HookTiming(hook="a.b", duration_ms=1.0, outcome="ok", error=None))
    timing_c = timeit_us(lambda: HookTiming.model_construct(hook="a.b", duration_ms=1.0, outcome="ok", error=None))
    print(f"  HopReply(...) {init:.2f} us vs model_construct {construct:.2f} us; "
          f"HookTiming {timing:.2f} vs {timing_c:.2f} us")
    rows.append(Row("fixes", "HopReply.model_construct (vs validated init)", construct, "us", init, "HopReply(...)",
                    note="model_construct is slower for small models"))
    return rows


async def main() -> list[Row]:
    rows = await measure()
    print_rows("envelope CPU per hop (experiments)", rows)
    return rows


if __name__ == "__main__":
    asyncio.run(main())
