"""The protocol version a worker announces: an orchestrator refuses a major it cannot serve.

The "2.0" group here is what a worker of a later protocol writes to the registry: its
announcement and its replicas' heartbeats (score and record) say "2.0", with a consumer
group on its stream. No hop may reach its stream; its hooks fail as unanswered (a critical
one fails the request with 503 `no_worker`, `finalize_connection` still runs); `hookbus
status` marks it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid

import pytest
from structlog.testing import capture_logs

from hookbus import Agent
from hookbus.bus.groups.registry import (
    REPLICA_TTL,
    GroupAnnouncement,
    RegistryView,
    ReplicaHeartbeat,
    announce,
)
from hookbus.bus.wire.protocol_version import PROTOCOL, refusal
from hookbus.services.cli.monitor import format_status, read_status
from hookbus.services.orchestrator.serving import OrchestratorService
from hookbus.skills import Context, HookData, HookError, Skill, hook
from hookbus.skills.descriptors import HookDescriptor, ToolDescriptor
from tests.faults.test_timeouts import stage_events
from tests.integration.stack import running_stack
from tests.waiting import wait_for


class FinalizeLedger(Skill):
    """In-process: the tools the LLM was offered and what `finalize_connection` saw, per
    completion id."""

    name = "ledger"
    errors: dict[str, str | None] = {}
    offered: dict[str, list[str]] = {}

    @hook("before_llm_call", 90)
    def tools(self, data: HookData, ctx: Context) -> None:
        self.offered[ctx.completion_id] = [t["function"]["name"] for t in data.tools or []]

    @hook("finalize_connection", 90)
    def record(self, data: HookData, ctx: Context) -> None:
        self.errors[ctx.completion_id] = data.error.code if data.error else None


class Shout(Skill):
    """A 1.0 group's hook after the refused one: the user's words upper-cased."""

    name = "shout"

    @hook("on_connection", 10)
    def shout(self, data: HookData, ctx: Context) -> HookData:
        data.messages[-1]["content"] = data.messages[-1]["content"].replace("still answered", "STILL ANSWERED")
        return data


FUTURE_TOOL = {"type": "function", "function": {"name": "future_tool", "parameters": {"type": "object", "properties": {}}}}


async def announce_future_group(client, critical: bool) -> None:
    redis, keys = client.redis, client.keys
    group = "future"
    await redis.xgroup_create(keys.hooks(group), group, id="0", mkstream=True)
    await announce(redis, keys, GroupAnnouncement(
        group=group, protocol="2.0",
        hooks=[HookDescriptor(skill="future", method="meddle", lifecycle="on_connection", priority=5, critical=critical)],
        tools=[ToolDescriptor(skill="future", name="future_tool", parameters_schema=FUTURE_TOOL)],
    ))
    beat = ReplicaHeartbeat(group=group, replica="future-1", protocol="2.0")
    await redis.zadd(keys.replicas(group), {beat.replica: beat.ts})
    await redis.set(keys.replica_heartbeat(group, beat.replica), beat.model_dump_json(), ex=int(REPLICA_TTL))


async def refused_by(service: OrchestratorService) -> RegistryView:
    """The orchestrator's registry view, once it refuses the group "future"."""
    assert service.runtime is not None
    registry = service.runtime.registry

    async def refused() -> bool:
        await registry.refresh()
        return "future" in registry.refused

    assert await wait_for(refused, timeout=5)
    return registry


def test_versions_of_the_served_major_are_served_and_others_refused() -> None:
    assert refusal("1.0") is None and refusal("1.7") is None
    assert refusal("2.0") == "speaks protocol 2.0; this orchestrator serves 1.x"
    assert "not a MAJOR.MINOR version" in (refusal("one") or "")


def test_an_announcement_without_the_field_speaks_1_0() -> None:
    old = GroupAnnouncement.model_validate_json('{"group": "g", "hooks": [], "tools": []}')
    assert old.protocol == "1.0"
    assert ReplicaHeartbeat.model_validate_json('{"group": "g", "replica": "r"}').protocol == "1.0"


async def test_a_group_speaking_2_0_is_refused_its_hooks_never_sent_and_status_marks_it(redis_url, prefix):
    agent = Agent("t", skills=[FinalizeLedger()])
    async with running_stack(redis_url, prefix, agent, {"shout": [Shout()]}) as (client, services, _):
        with capture_logs() as logs:
            await announce_future_group(client, critical=False)
            await refused_by(services[0])
        [line] = [entry for entry in logs if entry["event"] == "group_refused"]
        assert line["group"] == "future" and line["protocol"] == "2.0" and line["log_level"] == "error"

        cid = f"chatcmpl-{uuid.uuid4().hex}"
        completion = await client.complete("[[echo]] still answered", completion_id=cid)
        assert completion.choices[0].message.content == "STILL ANSWERED"  # the 1.0 group ran
        assert await client.redis.xlen(client.keys.hooks("future")) == 0  # no hop went to 2.0
        stages = await stage_events(client, cid, count=2)
        [stage] = [s for s in stages if s.group == "future"]
        assert stage.outcome == "skipped"
        assert "refused: speaks protocol 2.0" in (stage.error or "")
        assert "future_tool" not in FinalizeLedger.offered[cid]  # its tools are not offered

        status = await read_status(client.redis, client.keys)
        future = next(g for g in status.groups if g.name == "future")
        shout = next(g for g in status.groups if g.name == "shout")
        assert future.protocol == "2.0" and future.refused and future.replica_protocols == {"future-1": "2.0"}
        assert shout.protocol == PROTOCOL and shout.refused is None and shout.replica_protocols == {"shout-0": PROTOCOL}
        shown_text = format_status(status)
        assert "REFUSED: speaks protocol 2.0" in shown_text and "- future-1 (protocol 2.0)" in shown_text
        shown = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hookbus.services.cli.main", "status", "--json", stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "REDIS_URL": redis_url, "HOOKBUS_PREFIX": prefix},
        )
        stdout, _ = await asyncio.wait_for(shown.communicate(), 30)
        [shown_future] = [g for g in json.loads(stdout)["groups"] if g["name"] == "future"]
        assert shown_future["refused"] == "speaks protocol 2.0; this orchestrator serves 1.x"


async def test_a_critical_hook_of_a_refused_group_fails_the_request_and_finalize_runs(redis_url, prefix):
    agent = Agent("t", skills=[FinalizeLedger()])
    async with running_stack(redis_url, prefix, agent) as (client, services, _):
        await announce_future_group(client, critical=True)
        registry = await refused_by(services[0])
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        with pytest.raises(HookError) as caught:
            await client.complete("[[echo]] guarded", completion_id=cid)
        assert caught.value.status_code == 503 and caught.value.code == "no_worker"
        assert await client.redis.xlen(client.keys.hooks("future")) == 0
        assert FinalizeLedger.errors[cid] == "no_worker"

        # the group's replicas come back speaking 1.0: served again
        await announce(client.redis, client.keys, GroupAnnouncement(
            group="future",
            hooks=[HookDescriptor(skill="future", method="meddle", lifecycle="on_connection", priority=5, critical=True)],
        ))

        async def served() -> bool:
            await registry.refresh()
            return "future" in registry.groups and not registry.refused

        assert await wait_for(served, timeout=5)
