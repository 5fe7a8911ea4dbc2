"""Two agents behind one gateway on one Redis, each with its own orchestrators and worker
group (tests/faults/two_agents.py), as real processes: under concurrent load from several
keys each agent's requests reach only its orchestrators and its group; a key limited to
one agent gets a 403 for the other; the console shows both; and when every orchestrator of
one agent is killed, its requests end with a 503 while the other's keep their speed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import statistics
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.processes import Processes, free_port
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

ALL = "sk-agents-all-8c1f0b3d9e"
SUPPORT_ONLY = "sk-agents-support-4d2a7c"
BILLING_ONLY = "sk-agents-billing-9b3e1f"
ADMIN = "sk-agents-admin-7e5d2c4a"
KEYS = {
    ALL: {"peer_user_id": "ana"},
    SUPPORT_ONLY: {"peer_user_id": "sam", "agents": ["support"]},
    BILLING_ONLY: {"peer_user_id": "bo", "agents": ["billing"]},
    ADMIN: {"peer_user_id": "ops", "scopes": ["hookbus:admin"]},
}
ASK_WHERE = "[[tool:where {}]]"
ANSWERED_BY = {
    "support": re.compile(r"THE TOOL WHERE RETURNED: ORCH-SUPPORT-[AB]"),
    "billing": re.compile(r"the tool where returned: orch-billing-[ab]"),
}


async def ask(url: str, key: str, model: str, client: openai.AsyncOpenAI | None = None) -> tuple[str, float]:
    """A streamed request through the openai client: its text and how long it took."""
    async with contextlib.AsyncExitStack() as stack:
        if client is None:
            client = await stack.enter_async_context(openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0, timeout=60))
        started = time.perf_counter()
        stream = await client.chat.completions.create(
            model=model, stream=True, messages=[{"role": "user", "content": ASK_WHERE}]
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    return text, time.perf_counter() - started


async def p50(url: str, count: int = 30) -> float:
    """The median of `count` support requests in a row, on one connection."""
    async with openai.AsyncOpenAI(base_url=url, api_key=SUPPORT_ONLY, max_retries=0, timeout=60) as client:
        return statistics.median([(await ask(url, SUPPORT_ONLY, "support", client))[1] for _ in range(count)])


async def test_two_agents_keep_to_their_own_orchestrators_groups_and_keys(procs: Processes, tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps(KEYS))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    gateway = procs.gateway(port=port, api_keys=keys_file)
    orchestrators = {
        agent: [procs.orchestrator(f"tests.faults.two_agents:{agent}", instance=f"orch-{agent}-{n}") for n in "ab"]
        for agent in ("support", "billing")
    }
    workers = [
        procs.worker("support-desk", "tests.faults.two_agents:SupportDesk", replica="desk-1"),
        procs.worker("billing-ledger", "tests.faults.two_agents:BillingLedger", replica="ledger-1"),
    ]
    await procs.wait_ready(*orchestrators["support"], *orchestrators["billing"], *workers)
    await procs.wait_http(gateway, f"{base}/healthz")
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:

        async def listed(key: str) -> list[str]:
            response = await http.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            return sorted(m["id"] for m in response.json()["data"])

        async def both_listed() -> bool:
            return await listed(ALL) == ["billing", "support"]

        assert await wait_for(both_listed, timeout=15), await listed(ALL)
        assert await listed(SUPPORT_ONLY) == ["support"]

        # concurrent load from several keys: every answer names its own agent's orchestrator
        # and carries its own group's mark (a hop of the other agent would fail the request)
        calls = [(key, agent) for key, agents in ((ALL, ("support", "billing")), (SUPPORT_ONLY, ("support",)),
                                                  (BILLING_ONLY, ("billing",))) for agent in agents] * 6
        answers = await asyncio.gather(*(ask(f"{base}/v1", key, agent) for key, agent in calls))
        for (key, agent), (text, _) in zip(calls, answers, strict=True):
            assert ANSWERED_BY[agent].fullmatch(text), (key, agent, text)

        # a key limited to one agent: the same 403 for the other and for a name nobody serves
        for key, model in ((SUPPORT_ONLY, "billing"), (BILLING_ONLY, "support"), (SUPPORT_ONLY, "nobody")):
            with pytest.raises(openai.PermissionDeniedError) as refused:
                await ask(f"{base}/v1", key, model)
            assert refused.value.code == "model_not_allowed"
        started = time.perf_counter()
        with pytest.raises(openai.NotFoundError):
            await ask(f"{base}/v1", ALL, "nobody")
        assert time.perf_counter() - started < 2  # at once, not at the request's deadline

        # the console shows both agents with their orchestrators
        bus = (await http.get("/console/api/bus", headers={"Authorization": f"Bearer {ADMIN}"})).json()
        shown = {a["name"]: a["orchestrators"] for a in bus["agents"]}
        assert shown == {"support": ["orch-support-a", "orch-support-b"], "billing": ["orch-billing-a", "orch-billing-b"]}

    before = [await p50(f"{base}/v1") for _ in range(2)]  # twice: the spread of this machine
    for proc in orchestrators["billing"]:
        proc.kill()
    # billing's requests queue behind its dead orchestrators while support is measured again
    waiting = [asyncio.create_task(ask(f"{base}/v1", BILLING_ONLY, "billing")) for _ in range(4)]
    after = await p50(f"{base}/v1")
    ended = await asyncio.gather(*waiting, return_exceptions=True)
    for outcome in ended:
        assert isinstance(outcome, openai.APIStatusError) and outcome.status_code == 503, outcome
        assert outcome.code == "agent_unavailable"
    started = time.perf_counter()
    with pytest.raises(openai.InternalServerError) as gone:
        await ask(f"{base}/v1", BILLING_ONLY, "billing")
    assert gone.value.status_code == 503 and time.perf_counter() - started < 2
    print(
        f"support p50 of 30 requests: {before[0] * 1000:.1f} and {before[1] * 1000:.1f} ms with billing served, "
        f"{after * 1000:.1f} ms while billing's orchestrators were dead and its requests waited"
    )
    assert after < max(before) * 2 + 0.05, (before, after)  # loose: the machine it runs on is shared

