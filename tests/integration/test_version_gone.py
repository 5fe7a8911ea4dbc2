"""The rule when every replica of a request's pinned version is gone without draining
(hookbus.services.orchestrator.serving.version_pins): the request moves to the newest version at
its next hop to the group, recorded in its journal, and still ends well."""

from __future__ import annotations

import asyncio

from hookbus import Agent
from hookbus.bus.groups.registry import leave
from hookbus.services.worker.host import GroupHost
from hookbus.services.worker.replica import WorkerReplica
from hookbus.skills import Context, HookData, Skill, hook
from tests.integration.stack import running_stack
from tests.waiting import wait_for


class Shout(Skill):
    name = "shout"

    @hook("on_chunk", 10, timeout=2)
    async def shout(self, data: HookData, ctx: Context) -> HookData:
        if data.content:
            data.content = data.content.upper()
        return data


async def test_a_request_whose_version_vanished_moves_to_the_newest_and_says_so(redis_url, prefix):
    async with running_stack(redis_url, prefix, Agent("moves"), {"shout": [Shout()]}) as (client, _, [old]):
        keys = client.keys
        cid = "chatcmpl-moves-1"

        async def streamed() -> str:
            chunks = [c async for c in client.stream("[[words:30]] [[delay:100]]", completion_id=cid)]
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        answer = asyncio.ensure_future(streamed())

        async def pinned() -> bool:
            return await client.redis.hget(keys.journal(cid), "pin:shout") == old.version.encode()

        assert await wait_for(pinned, timeout=10)
        new = WorkerReplica(GroupHost("shout", [Shout()]), redis_url, prefix=prefix, replica="shout-new", version="v2")
        await new.start()
        try:
            # the old version's only replica vanishes as in a crash: no drain, no reading
            await old._stop_reading()
            await old.member.stop()
            await leave(client.redis, keys, "shout", old.replica)
            text = await asyncio.wait_for(answer, 60)
        finally:
            await new.stop()
    journal = {k.decode(): v.decode() for k, v in (await client.redis.hgetall(keys.journal(cid))).items()}
    assert journal["pin:shout"] == "v2"
    assert journal["moved:shout"] == f"{old.version}->v2"
    words = text.split()
    assert len(words) == 30 and words[-1] == "W29"  # the last chunks ran on v2
    assert await client.redis.zscore(keys.serving("shout", "v2"), cid) is None  # released at its end
    assert await client.redis.zscore(keys.serving("shout", old.version), cid) is None
