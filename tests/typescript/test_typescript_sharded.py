"""A TypeScript observer group on a sharded bus (HOOKBUS_SHARDS=3, every process): each
request's observations go to the observe shard of its completion id, and the TypeScript
replica reads every shard, so requests spread over the shards are each observed once, with
the final state, and every observe shard ends with nothing pending. The same skills as
test_typescript_parity.py (tests/typescript/skills/parity.ts), through the gateway with
the real `openai` client."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aredis

from hookbus.bus.connection.shards import shard_of
from hookbus.bus.connection.values import text
from hookbus.bus.keys import Keys
from tests.integration.processes import Proc, Processes
from tests.typescript.conftest import Stack, ts_stack, ts_worker
from tests.typescript.test_typescript_parity import (
    API_KEYS,
    HASHED,
    PARITY,
    PLAIN,
    observed,
    stream,
)
from tests.waiting import wait_for

SHARDS = 3
REQUESTS = 6


@pytest.fixture(scope="module")
async def sharded(redis_url: str, offline_llm_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    def workers(procs: Processes) -> list[Proc]:
        return [
            ts_worker(procs, "tsp", [PARITY], replica="tsp-1"),
            ts_worker(procs, "tsh", [HASHED], replica="tsh-1"),
        ]

    async with ts_stack(
        redis_url, offline_llm_url, tmp_path_factory.mktemp("ts-sharded"), agent="tests.typescript.py_skills:parity_agent",
        api_keys=API_KEYS, workers=workers, extra_env={"HOOKBUS_SHARDS": str(SHARDS)},
    ) as running:
        yield running


async def test_a_typescript_observer_reads_every_shard_and_sees_each_request_once(sharded: Stack) -> None:
    cids = []
    for n in range(REQUESTS):
        text, cid, error = await stream(sharded, PLAIN, f"[[echo]] sharded {n}")
        assert error is None and text == f"sharded {n}" and cid is not None
        cids.append(cid)
    used = Counter(shard_of(cid, SHARDS) for cid in cids)
    assert len(used) >= 2, f"the requests all fell on one shard: {used}"  # else the test proves nothing

    await sharded.wait_journal(lambda es: sum(e["hook"] == "ts-audit.finished" for e in es) >= REQUESTS, timeout=45)
    for n, cid in enumerate(cids):
        [seen] = observed(sharded, cid)  # once, whichever shard its observations went to
        assert seen["full"] == seen["last"] == f"sharded {n}" and seen["error"] is None

    redis = aredis.Redis.from_url(sharded.env["REDIS_URL"])
    keys = Keys(sharded.env["HOOKBUS_PREFIX"], shards=SHARDS)
    try:
        async def nothing_pending() -> bool:
            for shard in range(SHARDS):
                if (await redis.xpending(keys.observe_shard("tsp", shard), "tsp"))["pending"]:
                    return False
            return True

        assert await wait_for(nothing_pending, timeout=10)
        # the last id a shard's stream gave an entry: acked entries may be trimmed meanwhile
        written = [await last_id(redis, keys.observe_shard("tsp", shard)) for shard in range(SHARDS)]
    finally:
        await redis.aclose()
    assert sum(1 for n in written if n != "0-0") == len(used), (written, used)  # each used shard got its requests' entries


async def last_id(redis: aredis.Redis, stream: str) -> str:
    """The id of the last entry ever added to `stream` ("0-0": none, or no such stream)."""
    if not await redis.exists(stream):
        return "0-0"
    return text((await redis.xinfo_stream(stream))["last-generated-id"])
