"""Agents by name, in-process: each agent's requests reach only the orchestrators serving it
and the worker groups whose skills name it; a name nobody serves fails at once; an agent
whose orchestrators stopped answers a 503 at once; one orchestrator may serve several
agents; a request naming no agent still runs while one agent is served; `hookbus status`
and `hookbus monitor` tell the agents apart."""

from __future__ import annotations

import pytest

from hookbus import Agent
from hookbus.bus.client import HookbusClient
from hookbus.bus.connection.retrying import connect
from hookbus.bus.keys import Keys
from hookbus.services.cli.monitor import EventFilter, read_status, recent_events
from hookbus.skills import ServiceError
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

        redis = connect(redis_url)
        try:

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
