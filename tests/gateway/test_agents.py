"""The gateway in front of two agents (in-process orchestrators, one per agent, and each
agent's own worker group from tests/faults/two_agents.py): the `model` field picks the agent,
`GET /v1/models` lists the agents a key may call, a name nobody serves is a 404 at once, and a
key limited to one agent gets the same 403 for any other name, through the openai client."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from hookbus import Agent
from tests.gateway.server import RunningGateway, running_gateway
from tests.integration.two_agents_stack import two_agents
from tests.waiting import wait_for

ALL = "sk-test-agents-all"
BILLING_ONLY = "sk-test-agents-billing"
KEYS: dict[str, Any] = {ALL: {"peer_user_id": "ana"}, BILLING_ONLY: {"peer_user_id": "bo", "agents": ["billing"]}}


@pytest.fixture(scope="module")
def module_prefix() -> str:
    return f"ag{uuid.uuid4().hex[:8]}:"


@pytest.fixture(scope="module")
async def gateway(redis_url: str, module_prefix: str) -> AsyncIterator[RunningGateway]:
    served = {"orch-support": [Agent("support", models=["offline-small"])], "orch-billing": [Agent("billing")]}
    async with two_agents(redis_url, module_prefix, served), running_gateway(
        redis_url, module_prefix, api_keys=KEYS, models=["offline"]
    ) as gw:
        async with openai.AsyncOpenAI(base_url=gw.v1, api_key=ALL, max_retries=0) as client:

            async def both_listed() -> bool:
                return sorted([m.id async for m in client.models.list()]) == [
                    "billing", "support", "support/offline-small"
                ]

            assert await wait_for(both_listed, timeout=5)
        yield gw


async def say(gateway: RunningGateway, key: str, model: str, text: str = "[[echo]] Hello There") -> str:
    """The streamed answer's text (the groups' marks are on_chunk hooks: streams only)."""
    async with openai.AsyncOpenAI(base_url=gateway.v1, api_key=key, max_retries=0, timeout=20) as client:
        stream = await client.chat.completions.create(
            model=model, stream=True, messages=[{"role": "user", "content": text}]
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


async def test_the_model_field_picks_the_agent(gateway: RunningGateway) -> None:
    assert await say(gateway, ALL, "support") == "HELLO THERE"
    assert await say(gateway, ALL, "billing") == "hello there"
    assert await say(gateway, ALL, "support/offline-small") == "HELLO THERE"


async def test_a_name_nobody_serves_is_a_404_at_once(gateway: RunningGateway) -> None:
    for model in ("nobody", "offline", "billing/offline-small"):  # two agents: the gateway's own name picks none
        started = time.perf_counter()
        with pytest.raises(openai.NotFoundError) as missing:
            await say(gateway, ALL, model)
        assert missing.value.code == "model_not_found" and time.perf_counter() - started < 2


async def test_a_key_limited_to_one_agent_sees_and_calls_only_that_one(gateway: RunningGateway) -> None:
    assert await say(gateway, BILLING_ONLY, "billing") == "hello there"
    async with openai.AsyncOpenAI(base_url=gateway.v1, api_key=BILLING_ONLY, max_retries=0) as client:
        assert [m.id async for m in client.models.list()] == ["billing"]
    refusals = []
    for model in ("support", "support/offline-small", "nobody"):
        with pytest.raises(openai.PermissionDeniedError) as refused:
            await say(gateway, BILLING_ONLY, model)
        refusals.append((refused.value.code, refused.value.message.replace(model, "MODEL")))
    assert len(set(refusals)) == 1 and refusals[0][0] == "model_not_allowed"  # not a word on which exist
