"""A worker group whose hooks tag the data with the version they run at, for the rolling
upgrade test (tests/faults/test_rollout.py): `hookbus worker --group tagger --version V
tests.faults.rollout_skills:Tagger`.

The same skill (same hooks, same priorities) at every version, as a new release of one
skill is; what differs is what it does: each hook appends `[V]` (V from
`HOOKBUS_WORKER_VERSION`, which tests/integration/processes.py sets with `--version`).
Every hook also records in Redis which version ran it for which request
(`test:versions:{cid}`, a set) and finalize_connection records the request
(`test:finalized`, a hash cid -> version), so the test sees each request's versions and
its finalize even for what the answer does not show. An answer that starts with
"slowly" has its on_chunk hops held a while, and held on for as long as the test keeps
the key `test:hold` (bounded), so that a replica holds hops when it is killed however long
the machine takes to start the replica that replaces it.
"""

from __future__ import annotations

import asyncio
import os

from hookbus import Agent
from hookbus.skills import Context, HookData, Skill, hook, tool
from tests.faults.fault_skills import fault_key, redis_client

VERSION = os.environ.get("HOOKBUS_WORKER_VERSION", "unversioned")
TAG = f"[{VERSION}]"
SLOWLY = "slowly"
"""An answer starting with it has each of its chunks held `HOLD` seconds by on_chunk."""
HOLD = 0.3
HELD_AT_MOST = 20.0
"""Seconds a chunk waits for `test:hold` to go before it goes on regardless (under the
orchestrator's 30 s hop timeout)."""


async def ran_here(ctx: Context) -> None:
    await redis_client().sadd(fault_key("versions", ctx.completion_id), VERSION)


class Tagger(Skill):
    name = "tagger"

    @hook("on_chunk", 50)
    async def tag_chunk(self, data: HookData, ctx: Context) -> HookData:
        await ran_here(ctx)
        if (data.full_content or "").startswith(SLOWLY):
            await asyncio.sleep(HOLD)  # the point: a hop held while its replica is killed
            for _ in range(int(HELD_AT_MOST / HOLD)):
                if not await redis_client().exists(fault_key("hold")):
                    break
                await asyncio.sleep(HOLD)
        if data.content:
            data.content += TAG
        return data

    @hook("after_toolcall", 50)
    async def tag_result(self, data: HookData, ctx: Context) -> HookData:
        await ran_here(ctx)
        data.tool_result = f"{data.tool_result or ''}{TAG}"
        return data

    @hook("finalize_connection", 50)
    async def finalized(self, data: HookData, ctx: Context) -> HookData:
        await ran_here(ctx)
        await redis_client().hset(fault_key("finalized"), ctx.completion_id, VERSION)
        return data

    @tool
    async def lookup(self, q: str, ctx: Context) -> str:
        """Look a word up."""
        await ran_here(ctx)
        return f"found {q}{TAG}"


agent = Agent("rollout")
