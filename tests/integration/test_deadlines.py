"""A request whose deadline passed before it started is not run: its client stopped
waiting, so nothing runs for it (no hook, no LLM call) and it is answered with its
timeout error."""

from __future__ import annotations

import time
import uuid

from hookbus import Agent, Context, HookData, Skill, hook
from hookbus.bus.wire.envelopes import RequestEnvelope, encode
from tests.faults.helpers import read_until_terminal
from tests.integration.stack import running_stack


class Witness(Skill):
    name = "witness"

    def __init__(self) -> None:
        self.saw: list[str] = []

    @hook("on_connection")
    async def seen(self, data: HookData, ctx: Context) -> None:
        self.saw.append(ctx.completion_id)


async def test_a_request_past_its_deadline_is_answered_with_its_timeout_and_not_run(redis_url, prefix) -> None:
    witness = Witness()
    async with running_stack(redis_url, prefix, Agent("d", skills=[witness])) as (client, _, _):
        late, live = (f"chatcmpl-{uuid.uuid4().hex}" for _ in range(2))
        for cid, deadline in ((late, time.time() - 5), (live, time.time() + 30)):
            request = RequestEnvelope(
                completion_id=cid, messages=[{"role": "user", "content": "[[echo]] hi"}], deadline=deadline
            )
            await client.redis.xadd(client.keys.requests, encode(request))  # type: ignore[arg-type]
        expired = await read_until_terminal(client.redis, client.keys, late, timeout=10)
        served = await read_until_terminal(client.redis, client.keys, live, timeout=10)
    assert expired.error is not None and expired.error["status_code"] == 504
    assert expired.error["code"] == "deadline_exceeded"
    assert served.text == "hi"
    assert witness.saw == [live]
