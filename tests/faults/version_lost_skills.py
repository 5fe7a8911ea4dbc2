"""A worker group whose version v1 holds every on_chunk hop it gets, for the test of a
version that loses its every replica with hops in flight (tests/faults/test_version_lost.py):
`hookbus worker --group stall --version V tests.faults.version_lost_skills:Stall`.

At v1 the on_chunk hook records the request as held (`test:held`, a set) and then never
answers: the replica holds the hop until it is killed. At any other version it records
when it first judged each request (`test:moved`, cid -> unix time) and leaves the chunk
as it is. finalize_connection counts its runs per request (`test:finalized`).
"""

from __future__ import annotations

import asyncio
import os
import time

from hookbus import Agent
from hookbus.skills import Context, HookData, Skill, hook
from tests.faults.fault_skills import fault_key, redis_client

VERSION = os.environ.get("HOOKBUS_WORKER_VERSION", "unversioned")
HELD_VERSION = "v1"


class Stall(Skill):
    name = "stall"

    @hook("on_chunk", 50)
    async def judge(self, data: HookData, ctx: Context) -> None:
        if VERSION == HELD_VERSION:
            await redis_client().sadd(fault_key("held"), ctx.completion_id)
            await asyncio.Event().wait()  # the point: the hop is held until the replica dies
        await redis_client().hsetnx(fault_key("moved"), ctx.completion_id, repr(time.time()))

    @hook("finalize_connection", 50)
    async def finalized(self, data: HookData, ctx: Context) -> None:
        await redis_client().hincrby(fault_key("finalized"), ctx.completion_id, 1)


agent = Agent("version-lost")
