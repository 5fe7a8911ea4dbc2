"""Agents by name, in-process: each agent's requests reach only the orchestrators serving it
and the worker groups whose skills name it or that were deployed for it (`hookbus worker
--agent`); a name nobody serves fails at once; an agent
whose orchestrators stopped answers a 503 at once; one orchestrator may serve several
agents; a request naming no agent still runs while one agent is served; `hookbus status`
and `hookbus monitor` tell the agents apart."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hookbus import Agent
from hookbus.bus.client import HookbusClient
from hookbus.bus.connection.retrying import connect
from hookbus.bus.keys import Keys
from hookbus.services.cli.monitor import EventFilter, read_status, recent_events
from hookbus.services.worker.host import GroupHost
from hookbus.services.worker.replica import WorkerReplica
from hookbus.skills import Context, HookData, HookError, ServiceError, Skill, hook
from tests.integration.stack import wait_for_groups
from tests.integration.two_agents_stack import two_agents
from tests.waiting import wait_for

SAID = "[[echo]] Hello There"


async def answer(redis_url: str, prefix: str, agent: str | None, text: str = SAID) -> str:
    """The streamed answer's text (the groups' marks are on_chunk hooks: streams only)."""
    async with HookbusClient(redis_url, prefix=prefix, timeout=20, agent=agent) as client:
        return "".join([c.choices[0].delta.content or "" async for c in client.stream(text) if c.choices])


async def test_each_agent_reaches_only_its_orchestrators_and_groups(redis_url: str, prefix: str) -> None:
    support, billing = Agent("support"), Agent("billing")
    async with two_agents(redis_url, prefix, {"orch-support": [support], "orch-billing": [billing]}) as services:
        for _ in range(3):
            assert await answer(redis_url, prefix, "support") == "HELLO THERE"  # the desk group's mark
            assert await answer(redis_url, prefix, "billing") == "hello there"  # the ledger's
        assert services["orch-support"].served == 3 and services["orch-billing"].served == 3

        with pytest.raises(ServiceError) as unknown:
            await answer(redis_url, prefix, "nobody")
        assert (unknown.value.status_code, unknown.value.code) == (404, "model_not_found")
        with pytest.raises(ServiceError) as unnamed:  # either agent's orchestrator could take it
            await answer(redis_url, prefix, None)
        assert (unnamed.value.status_code, unnamed.value.code) == (400, "agent_required")
        assert "billing, support" in unnamed.value.message

        redis = connect(redis_url)
        try:
            assert await redis.xlen(Keys(prefix).requests) == 0  # nothing was queued for it

            async def all_recorded() -> bool:  # each process writes its records every 100 ms
                agents = (await read_status(redis, Keys(prefix))).agents
                return sum(a.requests_last_minute for a in agents) == 6

            assert await wait_for(all_recorded, timeout=5)
            status = await read_status(redis, Keys(prefix))
            by_name = {a.name: a for a in status.agents}
            assert by_name["support"].orchestrators == ["orch-support"]
            assert by_name["billing"].requests_last_minute == 3 and by_name["billing"].errors_last_minute == 0
            only = status.of_agent("billing")
            assert [a.name for a in only.agents] == ["billing"] and only.orchestrators == ["orch-billing"]
            assert [g.name for g in only.groups] == ["ledger"]
            records = await recent_events(redis, Keys(prefix))
            selection = EventFilter(agent="billing")
            groups = {r.group for r in records if selection.matches(r) and r.group}
            assert groups == {"ledger"}
        finally:
            await redis.aclose()

        await services["orch-billing"].stop()
        with pytest.raises(ServiceError) as gone:
            await answer(redis_url, prefix, "billing")
        assert (gone.value.status_code, gone.value.code) == (503, "agent_unavailable")
        # one agent served now: a request naming none runs on it, as before agents had names
        assert await answer(redis_url, prefix, None) == "HELLO THERE"


async def test_one_orchestrator_serves_several_agents(redis_url: str, prefix: str) -> None:
    async with two_agents(redis_url, prefix, {"orch-both": [Agent("support"), Agent("billing")]}) as services:
        assert await answer(redis_url, prefix, "billing") == "hello there"
        assert await answer(redis_url, prefix, "support") == "HELLO THERE"
        assert services["orch-both"].served == 2

        async def both_live() -> bool:
            async with HookbusClient(redis_url, prefix=prefix) as client:
                return (await client.agents.refresh()).live == ["billing", "support"]

        assert await wait_for(both_live, timeout=5)


class Audit(Skill):
    """Names no agent: it serves the ones its deployment picks. Fails a request of any other."""

    name = "audit"

    @hook("before_llm_call")
    def audited(self, data: HookData, ctx: Context) -> HookData:
        if ctx.metadata.agent_name != "billing":
            raise HookError(500, "wrong_agent", f"the audit group got a request of {ctx.metadata.agent_name!r}")
        data.messages[-1]["content"] += " audited"
        return data


async def test_a_group_deployed_for_one_agent_serves_only_that_agent(redis_url: str, prefix: str) -> None:
    """`hookbus worker --agent billing` (GroupHost's `agents`): the group's skill names no
    agent, and still only billing's requests reach it."""
    audit = WorkerReplica(GroupHost("audit", [Audit()], agents=["billing"]), redis_url, prefix=prefix, replica="audit-1")
    await audit.start()
    try:
        async with two_agents(redis_url, prefix, {"orch-both": [Agent("support"), Agent("billing")]}) as services:
            await wait_for_groups(list(services.values()), 3)
            for _ in range(2):
                assert await answer(redis_url, prefix, "billing") == "hello there audited"
                assert await answer(redis_url, prefix, "support") == "HELLO THERE"
            async def counted() -> bool:  # a replica counts a hop once its reply is written
                return audit.processed == 2

            assert await wait_for(counted, timeout=5), audit.processed
            redis = connect(redis_url)
            try:
                groups = {g.name for g in (await read_status(redis, Keys(prefix))).of_agent("support").groups}
            finally:
                await redis.aclose()
            assert groups == {"desk"}
    finally:
        await audit.stop()


def test_a_worker_refuses_an_agent_name_that_cannot_be_served() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hookbus.services.cli.main", "worker", "--group", "audit", "--agent", "bill ing",
         "tests.integration.test_agents_by_name:Audit"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode != 0
    assert "hookbus worker: agent name 'bill ing' cannot be served by name" in done.stderr, done.stderr
