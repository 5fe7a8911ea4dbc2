"""Large hook data does not stay in Redis, and what a hop may carry is bounded.

- A reply stream keeps no reply once its orchestrator read it, idle or not: a hook that
  returns megabytes leaves nothing behind on `replies:{instance}` when the request ended.
- ctx.state over HOOKBUS_MAX_STATE_BYTES does not ride a hop: a worker's reply that would
  carry it fails (its hook's changes are dropped, as for any failed hook) and an
  orchestrator does not send a hop carrying it; the events say why, in words.
"""

from __future__ import annotations

import uuid

import redis.asyncio as aredis

from hookbus import Agent, Context, HookData, Skill, hook
from hookbus.bus.settings import get_settings
from tests.integration.stack import running_stack
from tests.waiting import wait_for

BIG = 3 * 1024 * 1024
"""Bytes a hook puts in its result: over the 1 MiB state limit, under the 8 MiB hop limit."""


class Bulky(Skill):
    """In a worker group: a large answer (after_llm_call) when asked for one, and a large
    ctx.state (on_connection) when asked for that."""

    name = "bulky"

    @hook("on_connection")
    def stuff_state(self, data: HookData, ctx: Context) -> None:
        if "big-state-in-worker" in str(data.messages[-1]["content"]):
            ctx.state["blob"] = "s" * BIG

    @hook("after_llm_call")
    def big_answer(self, data: HookData, ctx: Context) -> HookData | None:
        message = data.response.choices[0].message if data.response is not None else None
        if message is not None and "big-answer" in str(message.content):
            message.content = "a" * BIG
            return data
        return None


class LocalStuffer(Skill):
    """In the orchestrator: a large ctx.state before the worker's after_llm_call hop."""

    name = "local-stuffer"

    @hook("before_llm_call")
    def stuff(self, data: HookData, ctx: Context) -> None:
        if "big-state-here" in str((data.messages or [{}])[-1].get("content")):
            ctx.state["blob"] = "s" * BIG


class Finals(Skill):
    name = "finals"

    def __init__(self) -> None:
        self.state_blob: dict[str, int] = {}

    @hook("finalize_connection")
    async def record(self, data: HookData, ctx: Context) -> None:
        self.state_blob[str(data.messages[0]["content"])] = len(ctx.state.get("blob", ""))


async def ask(client, text: str) -> str:
    completion = await client.complete([{"role": "user", "content": text}])
    return str(completion.choices[0].message.content)


async def test_a_large_reply_leaves_nothing_on_the_reply_stream_once_read(redis_url):
    prefix = f"sizes{uuid.uuid4().hex[:6]}:"
    async with running_stack(redis_url, prefix, Agent("sizes"), {"bulky": [Bulky()]}) as (client, services, _):
        answer = await ask(client, "[[echo]] big-answer")
        replies = services[0].keys.replies(services[0].instance)
        redis = aredis.Redis.from_url(redis_url)

        async def emptied() -> bool:
            return await redis.xlen(replies) == 0

        assert len(answer) == BIG
        assert await wait_for(emptied, timeout=3), f"{await redis.memory_usage(replies)} bytes left on {replies}"
        await redis.aclose()


async def test_ctx_state_over_its_limit_does_not_ride_a_hop_and_the_events_say_why(redis_url):
    assert get_settings().max_state_bytes < BIG < get_settings().max_hop_bytes
    prefix = f"sizes{uuid.uuid4().hex[:6]}:"
    finals = Finals()
    agent = Agent("sizes", skills=[LocalStuffer(), finals])
    async with running_stack(redis_url, prefix, agent, {"bulky": [Bulky()]}) as (client, services, _):
        worker_made = await ask(client, "[[echo]] big-state-in-worker")
        here_made = await ask(client, "[[echo]] big-state-here big-answer")
        redis = aredis.Redis.from_url(redis_url)

        async def told() -> int:  # the events are written in batches, a moment later
            entries = await redis.xrange(services[0].keys.events)
            count = b"".join(b"".join(fields.values()) for _, fields in entries).count(b"HOOKBUS_MAX_STATE_BYTES")
            return count if count >= 2 else 0

        reasons = await wait_for(told, timeout=5)
        await redis.aclose()
    assert worker_made == "big-state-in-worker"  # the request went on without the hook's change
    assert finals.state_blob["[[echo]] big-state-in-worker"] == 0
    assert here_made == "big-state-here big-answer"  # the worker's after_llm_call hop was not sent
    assert finals.state_blob["[[echo]] big-state-here big-answer"] == BIG  # in-process, the state is whole
    assert reasons >= 2
