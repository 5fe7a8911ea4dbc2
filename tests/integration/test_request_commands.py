"""What a quick request costs its journal, read from the server's MONITOR: its begin, the
stages' records before the LLM call (none when no hook ran at them: they go with the
call's record, hookbus.services.orchestrator.loop.run_steps `free`), the call's record,
its end. No ownership check
before finalize when the begin found the epoch ours moments before
(hookbus.services.orchestrator.serving.execution `still_owner`), and no write of the
last stages' records when finalize has no hook to run (hookbus.services.orchestrator.loop.finalize)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aredis

from hookbus import Agent
from hookbus.bus.client import HookbusClient
from hookbus.bus.keys import Keys
from hookbus.bus.store.read_answers import ReadAnswers
from hookbus.bus.store.run_steps import STEP_FIELD
from tests.faults.fault_skills import UserText
from tests.integration.stack import running_stack
from tests.waiting import wait_for

QUICK = 0.2
"""Seconds from begin to end under which the ownership check must be skipped (the
orchestrator skips it up to 0.25 s after the begin was sent)."""


@contextlib.asynccontextmanager
async def monitored(redis_url: str) -> AsyncIterator[list[dict]]:
    """Every command the server runs meanwhile, as MONITOR reports it (time, command)."""
    client = aredis.Redis.from_url(redis_url, decode_responses=True)
    seen: list[dict] = []
    ready = asyncio.Event()

    async def listen() -> None:
        async with client.monitor() as monitor:
            ready.set()
            async for command in monitor.listen():
                seen.append(command)

    task = asyncio.create_task(listen())
    await asyncio.wait_for(ready.wait(), 10)
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await task
        await client.aclose()


def deletes(command: str, key: str) -> bool:
    """Whether the MONITOR line `command` is a DEL of `key` (among others)."""
    words = command.split()
    return words[0] == "DEL" and key in words[1:]


@pytest.mark.parametrize(
    ("skills", "journal_commands", "records"),
    [
        ([], ["EVALSHA", "HSET", "EVALSHA"], [[0, 1, 2]]),
        ([UserText()], ["EVALSHA", "HSET", "HSET", "EVALSHA"], [[0, 1], [2]]),
    ],
    ids=["no hook", "an on_connection hook"],
)
async def test_a_quick_request_costs_its_journal_a_begin_its_records_and_an_end(
    redis_url, prefix, skills, journal_commands, records
):
    """Steps 0-2 are on_connection, before_llm_call and the LLM call: with no hook at the
    stages their records go with the call's, in one HSET; with one, before the call."""
    async with running_stack(redis_url, prefix, Agent("plain", skills=skills)) as (client, _, _):
        await client.complete("warm up")
        async with monitored(redis_url) as seen:
            ids = [(await client.complete(f"hello {n}")).id for n in range(5)]
            last = Keys(prefix).responses(ids[-1])

            async def all_seen() -> bool:  # the client deletes an answer's stream once read: last of all
                return any(deletes(c["command"], last) for c in seen)

            assert await wait_for(all_seen, timeout=10)
    quick = 0
    for cid in ids:
        journal = Keys(prefix).journal(cid)
        mine = [c for c in seen if journal in c["command"].split() and c.get("client_type") != "lua"]
        names = [c["command"].split()[0] for c in mine]
        checks = names.count("HGET")
        assert [n for n in names if n != "HGET"] == journal_commands, names
        written = [step_numbers(c["command"]) for c in mine if c["command"].startswith("HSET ")]
        assert written == records, written
        if mine[-1]["time"] - mine[0]["time"] < QUICK:
            quick += 1
            assert checks == 0, names
    assert quick, "no request took less than 0.2 s from begin to end"


def step_numbers(command: str) -> list[int]:
    """The step numbers of the step fields a MONITOR line's HSET writes."""
    return [int(word.split(":")[1]) for word in command.split() if word.startswith(STEP_FIELD)]


async def test_the_answers_read_together_are_deleted_in_one_command(redis_url, prefix):
    """A client deletes the response streams it read to their end several in one DEL, off
    the request's path (hookbus.bus.store.read_answers): eight concurrent requests, fewer
    DELs than requests, and every stream gone once they went."""
    async with running_stack(redis_url, prefix, Agent("plain")) as (client, _, _):
        await client.complete("warm up")
        async with monitored(redis_url) as seen:
            ids = [c.id for c in await asyncio.gather(*(client.complete(f"hello {n}") for n in range(8)))]
            streams = [Keys(prefix).responses(cid) for cid in ids]

            async def all_deleted() -> bool:
                return all(any(deletes(c["command"], s) for c in seen) for s in streams)

            assert await wait_for(all_deleted, timeout=10)
        dels = [c["command"] for c in seen if c["command"].startswith("DEL ") and c.get("client_type") != "lua"]
        assert len(dels) < len(ids), dels
        assert not await client.redis.exists(*streams)


async def test_closing_the_client_deletes_the_answers_it_read(redis_url, prefix):
    """What a client read is deleted when it closes, before the sweep's time comes."""
    async with running_stack(redis_url, prefix, Agent("plain")) as (client, _, _):
        reader = HookbusClient(redis_url, prefix=prefix, timeout=30)
        reader.read_answers = ReadAnswers(reader.redis, every=3600.0)  # only the close deletes it in time
        cid = (await reader.complete("hello")).id
        stream = Keys(prefix).responses(cid)
        assert await client.redis.exists(stream)
        await reader.close()
        assert not await client.redis.exists(stream)
