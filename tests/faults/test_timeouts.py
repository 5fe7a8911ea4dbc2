"""Hops that time out, worker groups with no replica, and deadlines (in-process stack)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from hookbus import Agent
from hookbus.bus.client import HookbusClient
from hookbus.services.cli.monitor import recent_events
from hookbus.skills import Context, DeadlineExceeded, HookData, HookError, Skill, hook
from tests.integration.stack import running_stack, wait_for_groups
from tests.waiting import wait_for


def rewrite(data: HookData, text: str) -> HookData:
    data.messages = [*data.messages[:-1], {"role": "user", "content": text}]
    return data


class Sleepy(Skill):
    """Answers after the orchestrator gave up on the hop (the hop timeout is cut to 0.4 s)."""

    name = "sleepy"

    @hook("on_connection", 10)
    async def doze(self, data: HookData, ctx: Context) -> HookData:
        await asyncio.sleep(1.2)  # the point: a hook slower than its hop's timeout
        return rewrite(data, "[[echo]] rewritten by a late hook")


class SleepyCritical(Skill):
    name = "sleepy-critical"

    @hook("on_connection", 20, scope="critical", critical=True)
    async def doze(self, data: HookData, ctx: Context) -> HookData:
        await asyncio.sleep(1.2)  # the point: a critical hook slower than its hop's timeout
        return data


class OwnTimeout(Skill):
    """Bounded by its own timeout, enforced in the worker."""

    name = "own-timeout"

    @hook("on_connection", 30, timeout=0.3)
    async def slow(self, data: HookData, ctx: Context) -> HookData:
        await asyncio.sleep(1.0)  # the point: slower than its own 0.3 s timeout
        return rewrite(data, "[[echo]] never applied")


async def stage_events(client, cid, lifecycle="on_connection", count=1):
    """The stage records of one request (the event writer flushes every few ms)."""

    async def events():
        return [
            e for e in await recent_events(client.redis, client.keys)
            if e.completion_id == cid and e.kind == "stage" and e.lifecycle == lifecycle
        ]

    async def enough():
        found = await events()
        return found if len(found) >= count else None

    return await wait_for(enough, timeout=2) or await events()


async def test_a_hop_past_its_timeout_counts_as_the_hook_failing_and_its_late_reply_is_ignored(redis_url, prefix):
    groups = {"sleepy": [Sleepy()], "critical": [SleepyCritical()]}
    async with running_stack(redis_url, prefix, Agent("t"), groups) as (client, services, _):
        runtime = services[0].runtime
        runtime.default_timeout = 0.4
        completion = await client.complete("[[echo]] the original", completion_id=(cid := f"chatcmpl-{uuid.uuid4().hex}"))
        assert completion.choices[0].message.content == "the original"  # the late hook's change never applied
        [stage] = [s for s in await stage_events(client, cid) if s.group == "sleepy"]
        assert stage.outcome == "timeout" and "no reply" in (stage.error or "")

        async def late_replies() -> int:  # the hook answers 1.2 s after it started
            return runtime.router.late_replies

        assert await wait_for(late_replies, timeout=5) == 1

        # the same for a critical hook aborts the run with a 500
        with pytest.raises(HookError) as caught:
            await client.complete("[[echo]] hi", auth={"scopes": ["critical"]})
        assert caught.value.status_code == 500 and caught.value.code == "hook_failed"
        assert "sleepy-critical.doze" in caught.value.message


async def test_a_hook_over_its_own_timeout_fails_in_the_worker(redis_url, prefix):
    async with running_stack(redis_url, prefix, Agent("t"), {"own": [OwnTimeout()]}) as (client, _, _):
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        completion = await client.complete("[[echo]] as sent", completion_id=cid)
        assert completion.choices[0].message.content == "as sent"
        [stage] = await stage_events(client, cid)
        assert stage.outcome == "timeout" and "timed out after 0.3s" in (stage.error or "")


class Optional(Skill):
    name = "optional"

    @hook("on_connection", 10)
    async def extra(self, data: HookData, ctx: Context) -> HookData:
        return rewrite(data, "[[echo]] should not happen")


class Required(Skill):
    name = "required"

    @hook("on_connection", 20, scope="strict", critical=True)
    async def must(self, data: HookData, ctx: Context) -> HookData:
        return data


async def test_a_group_without_live_replicas_is_skipped_or_503_when_critical(redis_url, prefix):
    groups = {"optional": [Optional()], "required": [Required()]}
    async with running_stack(redis_url, prefix, Agent("t"), groups) as (client, services, workers):
        for worker in workers:  # the groups stay announced, but no replica is alive
            await worker.stop()
        registry = services[0].runtime.registry

        async def both_dead() -> bool:
            await registry.refresh()
            return not registry.is_live("optional") and not registry.is_live("required")

        assert await wait_for(both_dead, timeout=5)
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        completion = await client.complete("[[echo]] without workers", completion_id=cid)
        assert completion.choices[0].message.content == "without workers"
        [stage] = await stage_events(client, cid)
        assert stage.group == "optional" and stage.outcome == "skipped"
        assert "no live replica" in (stage.error or "")

        with pytest.raises(HookError) as caught:
            await client.complete("[[echo]] hi", auth={"scopes": ["strict"]})
        assert caught.value.status_code == 503 and caught.value.code == "no_worker"
        # the workers are restarted for the stack's teardown
        for worker in workers:
            await worker.start()
        await wait_for_groups(services, 2)


class Ledger(Skill):
    name = "ledger"
    seen: list[tuple[str, int | None]] = []

    @hook("finalize_connection")
    async def note(self, data: HookData, ctx: Context) -> HookData:
        Ledger.seen.append((ctx.completion_id, data.error.status_code if data.error else None))
        return data


async def test_a_client_deadline_ends_in_a_504_instead_of_a_hang(redis_url, prefix):
    # nobody consumes the queue: the client gives up at its deadline
    async with HookbusClient(redis_url, prefix=prefix, timeout=0.8) as client:
        started = asyncio.get_running_loop().time()
        with pytest.raises(DeadlineExceeded) as caught:
            await client.complete("[[echo]] anyone?")
        assert caught.value.status_code == 504
        assert asyncio.get_running_loop().time() - started < 3

    # an orchestrator stops a run at the request's deadline; finalize still runs
    agent = Agent("t", skills=[Ledger()])
    async with running_stack(redis_url, prefix, agent) as (client, _, _):
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        with pytest.raises(DeadlineExceeded) as caught:
            await client.complete("[[delay:3000]] slow", completion_id=cid, timeout=1.0)
        assert caught.value.status_code == 504

        async def finalized() -> bool:
            return any(c == cid for c, _ in Ledger.seen)

        assert await wait_for(finalized, timeout=2)
        assert [s for c, s in Ledger.seen if c == cid] == [504]  # the status the client got
