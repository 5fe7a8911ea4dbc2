"""Redis comes back empty (no persistence, kill -9, restarted on the same port) while
requests run: a journal that vanished with Redis is not another orchestrator's claim. Each
request in flight ends with a 503 `request_state_lost` within seconds of the restart (not
at its deadline) and finalize_connection runs for it exactly once."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis.asyncio as aredis

from hookbus import Agent
from hookbus.bus.keys import Keys
from tests.faults.helpers import read_until_terminal, submit
from tests.finals import Finals
from tests.integration.stack import running_stack


@pytest.mark.parametrize("own_redis", [False], indirect=True, ids=["no-persistence"])
async def test_requests_in_flight_when_redis_comes_back_empty_end_at_once_and_finalize_once(own_redis):
    prefix = f"lost{uuid.uuid4().hex[:6]}:"
    keys = Keys(prefix)
    finals = Finals()
    redis = aredis.Redis.from_url(own_redis.url)
    async with running_stack(own_redis.url, prefix, Agent("lost", skills=[finals]), claim_idle=3.0):
        texts = {"streamed": "[[words:60]] [[delay:150]]", "whole": "[[delay:20000]] [[echo]] slow"}
        cids = {f"chatcmpl-lost-{kind}-{n}-{uuid.uuid4().hex[:6]}": kind for kind in texts for n in range(3)}
        for cid, kind in cids.items():
            await submit(redis, keys, texts[kind], completion_id=cid, stream=kind == "streamed", timeout=60)
        await asyncio.sleep(1.0)  # all of them running
        await asyncio.to_thread(own_redis.restart, kill=True)
        restarted = time.monotonic()
        outcomes = await asyncio.gather(
            *(read_until_terminal(redis, keys, cid, timeout=20) for cid in cids)
        )
        await asyncio.sleep(1.0)  # room for a second finalize, if there were one
    await redis.aclose()
    ended_after = [round(o.ended - restarted, 1) if o.terminal is not None else None for o in outcomes]
    assert all(o.terminal is not None for o in outcomes), ended_after
    assert all(o.error is not None and o.error["code"] == "request_state_lost" for o in outcomes), [o.error for o in outcomes]
    assert max(ended_after) < 8, ended_after  # seconds, not the 60 s deadline nor the 20 s call
    assert dict(finals.runs) == {cid: 1 for cid in cids}
    assert set(finals.codes.values()) == {"request_state_lost"}
    print(f"redis came back empty: {len(cids)} requests ended {min(ended_after)}-{max(ended_after)} s after the restart")
