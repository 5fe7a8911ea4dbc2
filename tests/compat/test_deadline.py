"""The request deadline is the orchestrator's too: when the client got its 504, the run stops
and finalize sees the same status."""

from __future__ import annotations

import time
import uuid

import openai
import pytest

from hookbus import Agent, Context, HookData, Skill, hook
from tests.gateway.server import running_gateway
from tests.integration.stack import running_stack
from tests.waiting import wait_for


class Finals(Skill):
    name = "finals"

    def __init__(self) -> None:
        self.seen: list[tuple[int | None, float]] = []

    @hook("finalize_connection")
    async def record(self, data: HookData, ctx: Context) -> None:
        self.seen.append((data.error.status_code if data.error else None, time.time()))


async def _finals_of(finals: Finals) -> list[tuple[int | None, float]]:
    return finals.seen


@pytest.mark.parametrize(
    ("stream", "content"), [(False, "[[delay:6000]] hi"), (True, "[[delay:400]] [[words:30]]")]
)
async def test_at_the_deadline_the_client_gets_504_the_run_stops_and_finalize_sees_504(redis_url, stream, content):
    prefix = f"dl{uuid.uuid4().hex[:8]}:"
    finals = Finals()
    async with running_stack(redis_url, prefix, Agent("slow", skills=[finals])), running_gateway(
        redis_url, prefix, models=["offline"], timeout=1.5
    ) as gw:
        client = openai.AsyncOpenAI(base_url=gw.v1, api_key="sk-any", max_retries=0, timeout=30)
        started = time.time()
        with pytest.raises(openai.APIError) as caught:  # streamed: the error event after the first chunks
            response = await client.chat.completions.create(
                model="offline", messages=[{"role": "user", "content": content}],
                stream=stream,
            )
            if stream:
                async for _ in response:
                    pass
        await client.close()
        await wait_for(lambda: _finals_of(finals), timeout=10)
    assert (caught.value.body or {}).get("code") == "deadline_exceeded"
    (status, finalized_at), = finals.seen
    assert status == 504
    assert finalized_at - started < 4.0  # the run stopped at the deadline (the model needs 6 s or 12 s)
