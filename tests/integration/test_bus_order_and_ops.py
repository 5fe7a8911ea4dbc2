"""Hook order across in-process hooks and worker groups, hop coalescing, load sharing,
and what `hookbus status` / `hookbus monitor` show."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from hookbus import Agent
from hookbus.services.cli.monitor import recent_events
from hookbus.skills import Context, HookData, Skill, hook
from tests.integration.stack import running_stack
from tests.waiting import wait_for


def tagger(label: str, priority: int) -> type[Skill]:
    """A skill whose on_connection hook appends its label to the last user message."""

    class Tagger(Skill):
        name = f"tag-{label}"

        @hook("on_connection", priority)
        def tag(self, data: HookData, ctx: Context) -> HookData:
            last = data.messages[-1]
            ctx.state.setdefault("order", []).append(label)
            data.messages[-1] = {**last, "content": f"{last['content']} {label}"}
            return data

    return Tagger


async def test_priority_order_interleaves_local_hooks_and_two_groups_with_coalesced_hops(redis_url, prefix):
    local5 = tagger("local5", 5)()
    a10, a30, a40 = tagger("a10", 10)(), tagger("a30", 30)(), tagger("a40", 40)()
    b20 = tagger("b20", 20)()
    agent = Agent("order", skills=[local5])
    groups = {"group-a": [a10, a30, a40], "group-b": [b20]}
    async with running_stack(redis_url, prefix, agent, groups) as (client, services, _):
        runtime = services[0].runtime
        hops_before, forwarded_before = runtime.hops, runtime.forwarded
        completion = await client.complete("[[echo]] start")
        on_connection_hops = runtime.hops - hops_before
        forwarded = runtime.forwarded - forwarded_before
    # each hook saw the previous one's output: the echo shows the whole chain in order
    assert completion.choices[0].message.content == "start local5 a10 b20 a30 a40"
    # hops: [a10] [b20] [a30 a40] for on_connection (a30 and a40 coalesce into one hop);
    # the other lifecycles have no remote hooks, so no hops
    assert on_connection_hops == 3
    # [b20] and [a30 a40] come straight after a remote segment: their hops were sent on
    # by the workers of group-a and group-b, not by the orchestrator
    assert forwarded == 2


class SlowCounter(Skill):
    name = "slow"

    @hook("before_llm_call")
    async def wait(self, data, ctx):
        await asyncio.sleep(0.02)  # the point: a hook slow enough that one replica cannot take it all


async def test_two_replicas_of_a_group_both_take_work_under_load(redis_url, prefix):
    async with running_stack(
        redis_url, prefix, Agent("load"), {"slow": [SlowCounter()]}, replicas=2
    ) as (client, _, workers):
        await asyncio.gather(*(client.complete(f"hi {n}") for n in range(40)))
    counts = [w.processed for w in workers]
    assert sum(counts) == 40
    assert min(counts) >= 10, counts


def hookbus(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "hookbus.services.cli.main", *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


async def test_status_and_monitor_show_what_happened(redis_url, prefix, service_env):
    groups = {"group-a": [tagger("a10", 10)()]}
    async with running_stack(redis_url, prefix, Agent("ops"), groups, replicas=2) as (client, _, workers):
        completion = await client.complete("[[echo]] watch me")

        async def recorded() -> bool:  # event writers flush in batches, after the answer
            records = [r for r in await recent_events(client.redis, client.keys) if r.completion_id == completion.id]
            return len(records) >= 3 and any(r.kind == "request" for r in records)

        assert await wait_for(recorded, timeout=5)
        status = await asyncio.to_thread(hookbus, service_env, "status")
        events = await asyncio.to_thread(
            hookbus, service_env, "monitor", "--from-start", "--completion-id", completion.id, "--count", "4",
        )
    assert "orch-0" in status
    assert "group-a" in status and "group-a-0" in status and "group-a-1" in status
    assert "tag-a10.tag@on_connection:10" in status
    assert "finished in the last minute 1" in status
    lines = events.strip().splitlines()
    assert len(lines) == 4
    assert all(completion.id[-12:] in line for line in lines)
    assert "request_start" in lines[0]  # the orchestrator took the request
    assert "on_connection" in lines[1] and "group-a" in lines[1] and "tag-a10.tag" in lines[1]
