"""Requests through the queue: orchestrator, worker groups and the client over real Redis."""

from __future__ import annotations

import asyncio

from hookbus import Agent
from hookbus.skills import PaymentRequired, Skill, hook
from tests.integration.stack import Notes, Upper, running_stack


async def test_a_streamed_request_goes_through_a_worker_group_and_back(redis_url, prefix):
    agent = Agent("bus")
    async with running_stack(redis_url, prefix, agent, {"shouty": [Upper()]}) as (client, _, workers):
        chunks = [c async for c in client.stream("[[words:5]]")]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "W0 W1 W2 W3 W4"
    assert workers[0].processed >= 1  # the on_chunk hops carry the chunks that gathered


async def test_a_non_streamed_request_returns_the_completion(redis_url, prefix):
    async with running_stack(redis_url, prefix, Agent("bus")) as (client, _, _):
        completion = await client.complete("[[echo]] hi there")
    assert completion.choices[0].message.content == "hi there"
    assert completion.id.startswith("chatcmpl-")


class Billing(Skill):
    name = "billing"

    @hook("on_connection", 1)
    async def charge(self, data, ctx):
        raise PaymentRequired("no credit", {"balance": 0})

    @hook("finalize_connection")
    async def release(self, data, ctx):
        ctx.session.data["finalized"] = ctx.session.data.get("finalized", 0) + 1
        ctx.session.data["error"] = data.error.status_code if data.error else None


async def test_a_402_raised_in_a_worker_reaches_the_client_and_finalize_runs_once(redis_url, prefix):
    agent = Agent("bus")
    async with running_stack(redis_url, prefix, agent, {"billing": [Billing()]}) as (client, services, _):
        try:
            await client.complete("hi", session_id="s402")
        except PaymentRequired as exc:
            assert exc.status_code == 402 and exc.details == {"balance": 0}
        else:
            raise AssertionError("expected a 402")
        session = await services[0].runtime.sessions.load(None, "s402")
    assert session == {"finalized": 1, "error": 402}


async def test_tools_of_a_worker_skill_run_in_the_worker_and_session_data_persists(redis_url, prefix):
    async with running_stack(redis_url, prefix, Agent("bus"), {"notes": [Notes()]}) as (client, _, workers):
        first = await client.complete('[[tool:remember {"note": "a"}]]', session_id="s1")
        second = await client.complete('[[tool:remember {"note": "b"}]]', session_id="s1")
    assert first.choices[0].message.content == "The tool remember returned: noted (1)"
    assert second.choices[0].message.content == "The tool remember returned: noted (2)"


async def test_concurrent_clients_never_see_each_others_chunks(redis_url, prefix):
    async with running_stack(redis_url, prefix, Agent("bus"), {"shouty": [Upper()]}) as (client, _, _):
        async def one(n: int) -> str:
            chunks = [c async for c in client.stream(f"[[echo]] request {n} says {n}")]
            assert {c.id for c in chunks} == {chunks[0].id}
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        texts = await asyncio.gather(*(one(n) for n in range(20)))
    assert texts == [f"REQUEST {n} SAYS {n}" for n in range(20)]
