"""The TypeScript worker on a real 3-master Redis Cluster (it refused one before): a
TypeScript group beside a Python one, an orchestrator and the gateway, each a real process
as a user runs them (tests/typescript/conftest.py), through the real `openai` client.
Requests whose completion ids fall on different shards (slots, nodes) each go through
both languages' hooks in one order, ctx.state both ways, the TypeScript chunk filter, and
finalize_connection in both."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from hookbus.bus.connection.shards import DEFAULT_CLUSTER_SHARDS, shard_of
from tests.embedded_cluster import EmbeddedCluster
from tests.integration.processes import Proc, Processes
from tests.typescript.conftest import API_KEYS, TS_SKILLS, ts_stack, ts_worker
from tests.typescript.test_typescript_worker import client, finalized, hooks

REQUESTS = 6


async def test_a_typescript_group_serves_requests_on_every_shard_of_a_cluster(
    redis_cluster: EmbeddedCluster, offline_llm_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    def workers(procs: Processes) -> list[Proc]:
        return [
            ts_worker(procs, "ts", TS_SKILLS, replica="ts-1"),
            procs.worker("py", "tests.typescript.py_skills:OrderProbe", replica="py-1"),
        ]

    async with ts_stack(
        redis_cluster.url, offline_llm_url, tmp_path_factory.mktemp("ts-cluster"), agent="tests.typescript.py_skills:agent",
        api_keys=API_KEYS, workers=workers,
    ) as stack:

        async def one(n: int) -> tuple[str, str]:
            async with client(stack) as api:
                stream = await api.chat.completions.create(
                    model="offline", stream=True, messages=[{"role": "user", "content": f"[[echo]] darn request {n}"}]
                )
                pieces, cid = [], ""
                async for chunk in stream:
                    cid = chunk.id
                    if chunk.choices and chunk.choices[0].delta.content:
                        pieces.append(chunk.choices[0].delta.content)
            return cid, "".join(pieces)

        answers = await asyncio.gather(*(one(n) for n in range(REQUESTS)))
        used = Counter(shard_of(cid, DEFAULT_CLUSTER_SHARDS) for cid, _ in answers)
        assert len(used) >= 2, f"the requests all fell on one shard: {used}"  # else the test proves nothing
        for n, (cid, text) in enumerate(answers):
            assert text == f"[filtered] request {n}", text
            entries = await stack.wait_journal(finalized(cid), timeout=30)
            mine = [e for e in entries if e["cid"] == cid]
            assert hooks(mine, "py-probe.first", "analytics.trackRequest", "py-probe.middle", "state-probe") == [
                "py-probe.first", "analytics.trackRequest", "py-probe.middle", "state-probe.relay",
            ]
            last = next(e for e in mine if e["hook"] == "py-probe.last")
            assert last["ts_mark"] == "ts saw python was here"
        log = (stack.procs.log_dir / "ts-1.log").read_text()
        assert "Redis Cluster" not in log and "worker_started" in log
