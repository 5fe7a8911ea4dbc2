"""One hop whose `reply_to` Redis refuses (a key of another type) does not spoil the
replies batched with it: they all arrive, every entry is acked, the worker goes on."""

from __future__ import annotations

import time

from hookbus.bus.connection.retrying import connect
from hookbus.bus.keys import Keys
from hookbus.bus.wire.envelopes import HookRef, HopEvent, HopReply, decode, encode
from hookbus.services.worker.host import GroupHost
from hookbus.services.worker.replica import WorkerReplica
from hookbus.skills import Context, HookData, Skill, hook
from tests.waiting import wait_for


class Quick(Skill):
    name = "quick"

    @hook("on_chunk")
    async def look(self, data: HookData, ctx: Context) -> None:
        return None


def hop(n: int, reply_to: str) -> HopEvent:
    return HopEvent(
        hop_id=f"hop-{n}", completion_id="c", lifecycle="on_chunk", stage_key=f"on_chunk#{n}",
        hooks=[HookRef(skill="quick", method="look")],
        data={"lifecycle": "on_chunk", "content": f"w{n}", "chunk_index": n},
        ctx={}, reply_to=reply_to, deadline=time.time() + 30,
    )


async def test_one_unwritable_reply_to_does_not_spoil_the_replies_batched_with_it(redis_url, prefix) -> None:
    keys = Keys(prefix)
    client = connect(redis_url)
    good, bad = f"{prefix}test-replies", f"{prefix}test-not-a-stream"
    await client.set(bad, "a string: an XADD to it is refused with WRONGTYPE")
    async with client.pipeline(transaction=False) as pipe:  # all read at once, answered together
        for n in range(6):
            pipe.xadd(keys.hooks("quick"), encode(hop(n, bad if n == 2 else good)))  # type: ignore[arg-type]
        await pipe.execute()
    worker = WorkerReplica(GroupHost("quick", [Quick()]), redis_url, prefix=prefix, concurrency=8, replica="q-0")
    await worker.start()
    try:
        async def replies() -> list[str] | None:
            found = [decode(f, HopReply).hop_id for _id, f in await client.xrange(good)]
            return found if len(found) >= 5 else None

        assert sorted(await wait_for(replies, timeout=10) or []) == [f"hop-{n}" for n in (0, 1, 3, 4, 5)]
        assert worker._batcher is not None and worker._batcher.batches < 6  # it was batched with others

        async def all_acked() -> bool:
            return int((await client.xpending(keys.hooks("quick"), "quick"))["pending"]) == 0

        assert await wait_for(all_acked, timeout=5)
        await client.xadd(keys.hooks("quick"), encode(hop(9, good)))  # type: ignore[arg-type]
        assert await wait_for(lambda: _has(client, good, "hop-9"), timeout=5)
    finally:
        await worker.stop()
        await client.aclose()


async def _has(client, stream: str, hop_id: str) -> bool:
    return any(decode(f, HopReply).hop_id == hop_id for _id, f in await client.xrange(stream))
