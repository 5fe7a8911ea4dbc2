"""A hop sent while Redis is restarting: the send fails, and is sent again with backoff
within the hop's deadline instead of failing its hooks at once (`HopUnsent`), so a request
whose hop falls in a short outage still gets its worker group's hooks."""

from __future__ import annotations

import asyncio

import pytest

from hookbus import Agent
from hookbus.skills import Context, HookData, Skill, hook
from tests.integration.stack import running_stack
from tests.waiting import wait_for

pytestmark = pytest.mark.slow


class Shout(Skill):
    """Upper-cases the request's last message before the LLM call (the offline model echoes it)."""

    name = "shout"

    @hook("before_llm_call")
    def shout(self, data: HookData, ctx: Context) -> HookData:
        last = data.messages[-1]
        last["content"] = "[[echo]] " + last["content"].removeprefix("[[echo]] ").upper()
        return data


class Gate(Skill):
    """Holds each request in on_connection (in the orchestrator's process) until opened."""

    name = "gate"

    def __init__(self) -> None:
        super().__init__()
        self.waiting = 0
        self.open = asyncio.Event()

    @hook("on_connection")
    async def hold(self, data: HookData, ctx: Context) -> HookData:
        self.waiting += 1
        await self.open.wait()
        return data


async def test_a_hop_sent_while_redis_restarts_reaches_its_group_once_redis_is_back(own_redis, prefix):
    gate = Gate()
    async with running_stack(own_redis.url, prefix, Agent("restart", skills=[gate]), {"shout": [Shout()]}) as (
        client, services, _,
    ):
        gate.open.set()
        assert (await client.complete("[[echo]] before")).choices[0].message.content == "BEFORE"
        gate.open.clear()
        answers = [asyncio.create_task(client.complete(f"[[echo]] during {n}")) for n in range(3)]
        async def all_held() -> bool:
            return gate.waiting == 4

        assert await wait_for(all_held, timeout=15)
        await asyncio.to_thread(own_redis.stop)
        gate.open.set()  # the hops go now, to a Redis that is down
        runtime = services[0].runtime
        assert runtime is not None
        async def sent_again() -> bool:  # each hop failed at least once, and waits to go again
            return runtime.router.sends_retried >= 3

        assert await wait_for(sent_again, timeout=15)
        await asyncio.to_thread(own_redis.start)
        done = await asyncio.gather(*answers)
        assert [c.choices[0].message.content for c in done] == [f"DURING {n}" for n in range(3)]
