"""Redis reaches `maxmemory` (noeviction) in the middle of a request's hops: a hop Redis
refuses to queue ends the request with a 503 `redis_out_of_memory` (not a 500 with Redis's
text), and a worker's reply Redis refuses is retried, so the request goes on once memory
returns instead of waiting out the hop's timeout. finalize_connection runs once either way.

Each hook that fills Redis does so itself, at a known point of the request (a Redis of
this test's own, without persistence); the test gives the memory back a second later."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from hookbus import Agent, Context, HookData, Skill, hook
from hookbus.bus.keys import Keys
from tests.faults.helpers import read_until_terminal, submit
from tests.integration.stack import running_stack
from tests.waiting import wait_for

REFUSED_FOR = 1.0
"""Seconds Redis refuses writes before the test gives the memory back."""
HOOK_TIMEOUT = 20.0


def fill(url: str) -> None:
    """Put Redis over its maxmemory: fill it, then lower maxmemory below what it uses."""
    with redis.Redis.from_url(url) as client:
        for n in range(20):
            client.set(f"filler:{n}", b"x" * 100_000)
        client.config_set("maxmemory", str(int(client.info("memory")["used_memory"]) // 2))


class FillBefore(Skill):
    """In the orchestrator: fills Redis before the LLM call of a request that asks for it."""

    name = "fill-before"
    url = ""

    @hook("before_llm_call")
    def fill(self, data: HookData, ctx: Context) -> None:
        if "fill-before" in str((data.messages or [{}])[-1].get("content")):
            fill(self.url)


class FillInWorker(Skill):
    """In a worker group: fills Redis while it runs, so its own reply is refused; marks
    the request's state, which the orchestrator sees only if the reply arrived."""

    name = "fill-in-worker"
    url = ""

    @hook("after_llm_call", timeout=HOOK_TIMEOUT)
    def check(self, data: HookData, ctx: Context) -> HookData:
        if ctx.metadata.completion_id.startswith("chatcmpl-reply"):
            fill(self.url)
        ctx.state["checked"] = True
        return data


class Finals(Skill):
    name = "finals"

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.seen: dict[str, tuple[str | None, Any]] = {}

    @hook("finalize_connection")
    async def record(self, data: HookData, ctx: Context) -> None:
        self.runs[ctx.metadata.completion_id] += 1
        self.seen[ctx.metadata.completion_id] = (data.error.code if data.error else None, ctx.state.get("checked"))


async def give_memory_back(client: aredis.Redis) -> float:
    """Once Redis is full, wait REFUSED_FOR seconds and lift the limit; when it was full."""
    async def full() -> bool:
        return int((await client.config_get("maxmemory"))["maxmemory"]) > 0

    await wait_for(full, timeout=30, every=0.02)
    full_at = time.monotonic()
    await asyncio.sleep(REFUSED_FOR)
    await client.config_set("maxmemory", "0")
    await client.delete(*(f"filler:{n}" for n in range(20)))
    return full_at


@pytest.mark.parametrize("own_redis", [False], indirect=True, ids=["no-persistence"])
async def test_redis_refusing_a_hop_or_a_reply_mid_request(own_redis):
    prefix = f"oomhop{uuid.uuid4().hex[:6]}:"
    keys = Keys(prefix)
    FillBefore.url = FillInWorker.url = own_redis.url
    finals = Finals()
    agent = Agent("oom-hops", skills=[FillBefore(), finals])
    client = aredis.Redis.from_url(own_redis.url)
    async with running_stack(own_redis.url, prefix, agent, {"checks": [FillInWorker()]}):
        outcomes = {}
        for kind, text in (("hop", "fill-before [[echo]] hi"), ("reply", "[[echo]] hi")):
            cid = f"chatcmpl-{kind}-{uuid.uuid4().hex[:8]}"
            freeing = asyncio.create_task(give_memory_back(client))
            await submit(client, keys, text, completion_id=cid, stream=False, timeout=60)
            outcome = await read_until_terminal(client, keys, cid, timeout=40)
            full_at = await freeing
            assert outcome.ended is not None, kind
            outcomes[kind] = (cid, outcome, outcome.ended - full_at)
    await client.aclose()

    cid, outcome, _ = outcomes["hop"]  # its next hop was refused: the request failed, as a 503
    assert outcome.error is not None and (outcome.error["status_code"], outcome.error["code"]) == (503, "redis_out_of_memory")
    assert finals.seen[cid][0] == "redis_out_of_memory" and finals.runs[cid] == 1

    cid, outcome, took = outcomes["reply"]  # its reply was refused, then sent again: it succeeded
    assert outcome.error is None and outcome.terminal is not None
    assert finals.seen[cid] == (None, True) and finals.runs[cid] == 1
    assert took < REFUSED_FOR + 3, f"{took:.1f} s: the reply waited for the hook's timeout ({HOOK_TIMEOUT} s)"
    print(f"redis refusing a worker's reply for {REFUSED_FOR} s: the request ended {took:.1f} s after Redis was full")
