"""A conversation continued with `previous_response_id` past the model's window: the agent
sees every earlier turn and compacts them in the run, so each turn still gets its answer.

Its own stack: an agent on `offline-tiny` (a 1024-token window; a longer prompt is refused
with a 400 `context_length_exceeded`) whose in-process skill records every compaction.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from hookbus import Agent, Compaction, Skill
from hookbus.skills import Context
from tests.gateway.conftest import API_KEYS, KEY
from tests.gateway.server import RunningGateway, running_gateway
from tests.integration.stack import running_stack

MODEL = "offline-tiny"


class Compactions(Skill):
    name = "compactions"

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []

    async def on_compaction(self, outcome: Compaction, ctx: Context | None) -> None:
        self.seen.append((outcome.stage, ctx.completion_id if ctx else None))


@pytest.fixture(scope="module")
def compactions() -> Compactions:
    return Compactions()


@pytest.fixture(scope="module")
async def stack(redis_url: str, module_prefix: str, compactions: Compactions) -> AsyncIterator[Any]:
    agent = Agent("tiny-window", model=MODEL, skills=[compactions])
    async with running_stack(redis_url, module_prefix, agent) as running:
        yield running


@pytest.fixture(scope="module")
async def gateway(stack: Any, redis_url: str, module_prefix: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(redis_url, module_prefix, api_keys=API_KEYS, models=[MODEL]) as gw:
        yield gw


async def test_turns_chained_past_the_window_are_compacted_and_all_answered(gateway, compactions):
    ids: list[str] = []
    async with openai.AsyncOpenAI(base_url=gateway.v1, api_key=KEY, max_retries=0, timeout=30) as client:
        previous = None
        for turn in range(8):
            response = await client.responses.create(
                model=MODEL, input=f"turn {turn} [[words:120]]", previous_response_id=previous,
            )
            assert response.status == "completed", turn
            assert response.output_text == " ".join(f"w{i}" for i in range(120))
            ids.append(previous := response.id)
    # 8 turns of ~250 tokens do not fit 1024: the runs of the later turns compacted them
    compacted = [cid for stage, cid in compactions.seen if stage != "none"]
    assert compacted, "no run compacted the conversation"
    assert set(compacted) <= set(ids[2:])
