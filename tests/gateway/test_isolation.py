"""Callers are isolated: sessions and memory belong to the authenticated principal.

The attack: bob sends alice's session id (as `X-Session-Id` and as the body's `user`)
through the real gateway with his own API key, hoping to read or rewrite her session, and
asks the memory skill for episodes, hoping to see hers.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from hookbus import Agent, CompactionPolicy
from hookbus.bus.keys import Keys
from hookbus.bus.store.sessions import SessionStore
from hookbus.skills.builtin import MemorySkill
from tests.gateway.conftest import Notes
from tests.gateway.server import RunningGateway, running_gateway
from tests.integration.stack import running_stack

ALICE, BOB = "sk-iso-alice-0123456789", "sk-iso-bob-0123456789"
KEYS = {ALICE: {"peer_user_id": "alice", "scopes": []}, BOB: {"peer_user_id": "bob", "scopes": []}}


@pytest.fixture(scope="module")
async def stack(redis_url: str, module_prefix: str) -> AsyncIterator[Any]:
    groups = {"tools": [Notes()], "memory": [MemorySkill(redis_url=redis_url, prefix=module_prefix)]}
    agent = Agent("isolation", compaction_policy=CompactionPolicy(window=1000))
    async with running_stack(redis_url, module_prefix, agent, groups) as running:
        yield running


@pytest.fixture(scope="module")
async def gateway(stack: Any, redis_url: str, module_prefix: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(redis_url, module_prefix, api_keys=KEYS, models=["offline"]) as gw:
        yield gw


def client_of(gateway: RunningGateway, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.v1, api_key=key, max_retries=0)


async def remember(client: openai.AsyncOpenAI, note: str, sid: str, *, header: bool) -> str:
    completion = await client.chat.completions.create(
        model="offline",
        messages=[{"role": "user", "content": f'[[tool:remember {{"note": "{note}"}}]]'}],
        **({"extra_headers": {"X-Session-Id": sid}} if header else {"user": sid}),
    )
    return completion.choices[0].message.content or ""


@pytest.mark.parametrize("header", [True, False], ids=["x-session-id", "user-field"])
async def test_bob_sending_alices_session_id_neither_sees_nor_changes_her_session(
    gateway, stack, module_prefix, header
) -> None:
    sid = f"shared-{uuid.uuid4().hex[:8]}"
    sessions = SessionStore(stack[0].redis, Keys(module_prefix))
    async with client_of(gateway, ALICE) as alice, client_of(gateway, BOB) as bob:
        assert await remember(alice, "alice secret 1", sid, header=header) == "The tool remember returned: noted (1)"
        assert await remember(alice, "alice secret 2", sid, header=header) == "The tool remember returned: noted (2)"
        # bob's tool sees an empty session of his own: his note is the first
        assert await remember(bob, "bob was here", sid, header=header) == "The tool remember returned: noted (1)"
        # alice's session is as she left it
        assert await remember(alice, "alice secret 3", sid, header=header) == "The tool remember returned: noted (3)"
    assert (await sessions.load("alice", sid))["notes"] == ["alice secret 1", "alice secret 2", "alice secret 3"]
    assert (await sessions.load("bob", sid))["notes"] == ["bob was here"]
    assert await sessions.load(None, sid) == {}  # nor is there a shared, owner-less one


async def test_bob_does_not_see_alices_memory_episodes(gateway, stack, module_prefix) -> None:
    long_conversation: list[dict[str, Any]] = []
    for turn in range(12):
        long_conversation += [
            {"role": "user", "content": f"alice question {turn}: " + "budget " * 40},
            {"role": "assistant", "content": f"answer {turn}: " + "numbers " * 40},
        ]
    long_conversation.append({"role": "user", "content": "and now?"})
    list_memory = [{"role": "user", "content": "[[tool:list_memory {}]]"}]
    async with client_of(gateway, ALICE) as alice, client_of(gateway, BOB) as bob:
        await alice.chat.completions.create(model="offline", messages=long_conversation)  # compacts
        theirs = await bob.chat.completions.create(model="offline", messages=list_memory)
        hers = await alice.chat.completions.create(model="offline", messages=list_memory)
    assert theirs.choices[0].message.content == "The tool list_memory returned: No memory episodes yet."
    assert "summarized" in (hers.choices[0].message.content or "")  # her episode, listed for her
    assert await stack[0].redis.zcard(f"{module_prefix}memory:alice") == 1
    assert not await stack[0].redis.exists(f"{module_prefix}memory:bob")
