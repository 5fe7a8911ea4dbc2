"""Garbage on every stream, oversized and invalid requests, replies in the wrong shape."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest

from hookbus import Agent
from hookbus.bus.groups.registry import GroupAnnouncement, announce, heartbeat
from hookbus.bus.keys import ORCHESTRATOR_GROUP
from hookbus.bus.limits import RequestLimits
from hookbus.bus.wire.envelopes import HookRef, HopEvent, HopReply, MonitorRecord, decode, encode
from hookbus.services.cli.monitor import recent_events
from hookbus.skills import Context, HookData, Skill, hook
from hookbus.skills.descriptors import HookDescriptor
from tests.faults.helpers import pending, read_until_terminal
from tests.integration.stack import Upper, running_stack, wait_for_groups
from tests.waiting import wait_for


class WrongLifecycle(Skill):
    """Returns data of another lifecycle: its reply must count as the hook failing."""

    name = "wrong-lifecycle"

    @hook("on_connection", 5)
    def confused(self, data: HookData, ctx: Context) -> HookData:
        return HookData(lifecycle="on_message", messages=[{"role": "user", "content": "[[echo]] hijacked"}])


def new_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


async def dead_letters(client, keys, source: str, count: int = 1) -> list[dict[bytes, bytes]]:
    """The dead letters set aside from `source`, once there are `count` of them (or after 1 s)."""

    async def found() -> list[dict[bytes, bytes]]:
        return [f for _id, f in await client.xrange(keys.dead_letter) if f[b"source"] == source.encode()]

    async def enough() -> list[dict[bytes, bytes]] | None:
        letters = await found()
        return letters if len(letters) >= count else None

    return await wait_for(enough, timeout=1) or await found()


async def test_garbage_on_the_requests_stream_is_dead_lettered_and_answered_when_possible(redis_url, prefix):
    async with running_stack(redis_url, prefix, Agent("t")) as (client, services, _):
        services[0].limits = RequestLimits(max_request_bytes=1000)  # the envelope may hold 64 KiB more
        redis, keys = client.redis, client.keys
        bad_json, bad_version, too_big = new_id(), new_id(), new_id()
        await redis.xadd(keys.requests, {"junk": "no envelope field"})
        await redis.xadd(keys.requests, {"e": b"\xff\xfe not json"})
        await redis.xadd(keys.requests, {"e": json.dumps({"v": 1, "kind": "request", "completion_id": bad_json, "messages": []})})
        await redis.xadd(keys.requests, {"e": json.dumps({"v": 99, "kind": "request", "completion_id": bad_version, "messages": [{"role": "user", "content": "hi"}]})})
        big = {"v": 1, "kind": "request", "completion_id": too_big, "messages": [{"role": "user", "content": "x" * 70_000}]}
        await redis.xadd(keys.requests, {"e": json.dumps(big)})

        invalid = await read_until_terminal(redis, keys, bad_json, timeout=10)
        assert invalid.error is not None and invalid.error["status_code"] == 400
        assert invalid.error["code"] == "invalid_request" and "messages" in invalid.error["message"]
        version = await read_until_terminal(redis, keys, bad_version, timeout=10)
        assert version.error["status_code"] == 400 and "unknown envelope version 99" in version.error["message"]
        oversized = await read_until_terminal(redis, keys, too_big, timeout=10)
        assert oversized.error["status_code"] == 413 and oversized.error["code"] == "request_too_large"

        letters = await dead_letters(redis, keys, keys.requests, count=5)
        assert len(letters) == 5
        assert not any(k.startswith(b"orig:") for f in letters for k in f)  # no content kept
        # and the orchestrator goes on serving
        completion = await client.complete("[[echo]] still serving")
        assert completion.choices[0].message.content == "still serving"
        assert await pending(redis, keys.requests, ORCHESTRATOR_GROUP) == 0
        assert services[0].refused == 5


async def test_garbage_on_a_hooks_stream_is_dead_lettered_and_the_worker_goes_on(redis_url, prefix):
    async with running_stack(redis_url, prefix, Agent("t"), {"shouty": [Upper()]}) as (client, _, workers):
        redis, keys = client.redis, client.keys
        await redis.xadd(keys.hooks("shouty"), {"e": "{not json"})
        await redis.xadd(keys.hooks("shouty"), {"e": json.dumps({"v": 2, "kind": "hop"})})
        letters = await dead_letters(redis, keys, keys.hooks("shouty"), count=2)
        assert len(letters) == 2
        assert all(f[b"reason"].startswith(b"not a valid HopEvent") for f in letters)
        chunks = [c async for c in client.stream("[[echo]] loud and clear")]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "LOUD AND CLEAR"
        assert workers[0].dead_lettered == 2

        async def all_acked() -> bool:  # a worker's acks follow its replies
            return await pending(redis, keys.hooks("shouty"), "shouty") == 0

        assert await wait_for(all_acked, timeout=5)


async def test_a_hop_naming_a_hook_the_worker_lacks_fails_as_a_whole(redis_url, prefix):
    """The worker answers with `failure` and records its hop as `hop_failed`, not as a hook
    that ran and failed."""
    async with running_stack(redis_url, prefix, Agent("t"), {"shouty": [Upper()]}) as (client, _, _):
        redis, keys = client.redis, client.keys
        cid, reply_to = new_id(), f"{prefix}:test-replies"
        event = HopEvent(
            hop_id=uuid.uuid4().hex, completion_id=cid, lifecycle="on_chunk", stage_key="on_chunk",
            hooks=[HookRef(skill="upper", method="whisper")], data={"lifecycle": "on_chunk"},
            ctx={}, reply_to=reply_to, deadline=time.time() + 10,
        )
        await redis.xadd(keys.hooks("shouty"), encode(event))
        replies = await wait_for(lambda: redis.xrange(reply_to))
        assert len(replies) == 1
        reply = decode(replies[0][1], HopReply)
        assert reply.failure is not None and "no hook 'upper.whisper'" in reply.failure

        async def hop_records() -> list[MonitorRecord]:
            return [r for r in await recent_events(redis, keys) if r.completion_id == cid and r.kind == "hop"]

        (record,) = await wait_for(hop_records)
        assert record.outcome == "hop_failed" and record.error == reply.failure


async def test_garbage_on_a_reply_stream_is_dropped_and_the_router_goes_on(redis_url, prefix):
    async with running_stack(redis_url, prefix, Agent("t"), {"shouty": [Upper()]}) as (client, services, _):
        router = services[0].runtime.router
        await client.redis.xadd(router.reply_stream, {"e": "garbage"})
        chunks = [c async for c in client.stream("[[echo]] fine")]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "FINE"
        assert router.bad_replies == 1
        assert await dead_letters(client.redis, client.keys, router.reply_stream)


@pytest.mark.parametrize("garbage", [
    "not a response item",
    '{"v": 1, "kind": "batch", "items": [{"kind": "chunk", "completion_id": "x"}, {"kind": "nope"}]}',
], ids=["not json", "a batch with a bad item"])
async def test_garbage_on_a_response_stream_is_skipped_by_the_client(redis_url, prefix, garbage):
    async with running_stack(redis_url, prefix, Agent("t")) as (client, _, _):
        cid = new_id()
        await client.redis.xadd(client.keys.responses(cid), {"e": garbage})
        completion = await client.complete("[[echo]] through the noise", completion_id=cid)
        assert completion.choices[0].message.content == "through the noise"
        assert await dead_letters(client.redis, client.keys, client.keys.responses(cid))


async def test_garbage_on_the_events_stream_is_ignored_by_the_monitor(redis_url, prefix):
    async with running_stack(redis_url, prefix, Agent("t")) as (client, _, _):
        await client.redis.xadd(client.keys.events, {"e": "nonsense"})
        await client.redis.xadd(client.keys.events, {"x": "y"})
        good = MonitorRecord(kind="stage", completion_id="c1", lifecycle="on_message")
        await client.redis.xadd(client.keys.events, encode(good))
        records = await recent_events(client.redis, client.keys)
        assert [r.completion_id for r in records][-1:] == ["c1"]


async def test_a_reply_of_the_wrong_lifecycle_counts_as_the_hook_failing(redis_url, prefix):
    async with running_stack(redis_url, prefix, Agent("t"), {"confused": [WrongLifecycle()]}) as (client, _, _):
        cid = new_id()
        completion = await client.complete("[[echo]] untouched", completion_id=cid)
        assert completion.choices[0].message.content == "untouched"
        stage = await _stage(client, cid, "on_connection")
        # refused by the runner in the worker, as it is in-process (test_failure_rules)
        assert stage.outcome == "failed"
        assert stage.error == "returned the HookData of on_message, expected that of on_connection"


async def test_a_raw_reply_in_the_wrong_shape_counts_as_the_hook_failing(redis_url, prefix):
    """A 'worker' that is not hookbus: it answers every hop with data of the wrong shape."""
    async with running_stack(redis_url, prefix, Agent("t")) as (client, services, _):
        redis, keys = client.redis, client.keys
        group = "impostor"
        await redis.xgroup_create(keys.hooks(group), group, id="0", mkstream=True)
        await announce(redis, keys, GroupAnnouncement(
            group=group,
            hooks=[HookDescriptor(skill="impostor", method="meddle", lifecycle="on_connection", priority=5)],
        ))
        await heartbeat(redis, keys, group, "impostor-1")
        await wait_for_groups(services, 1)

        async def impostor() -> None:
            while True:
                response = await redis.xreadgroup(group, "impostor-1", {keys.hooks(group): ">"}, count=10, block=100)
                for _stream, entries in response or ():
                    for entry_id, fields in entries:
                        event = decode(fields, HopEvent)
                        reply = HopReply(
                            hop_id=event.hop_id, completion_id=event.completion_id, replica="impostor-1",
                            data={"lifecycle": "on_connection", "messages": "not a list"},
                        )
                        await redis.xadd(event.reply_to, encode(reply))
                        await redis.xack(keys.hooks(group), group, entry_id)

        task = asyncio.create_task(impostor())
        try:
            cid = new_id()
            completion = await client.complete("[[echo]] as written", completion_id=cid)
        finally:
            task.cancel()
        assert completion.choices[0].message.content == "as written"
        stage = await _stage(client, cid, "on_connection")
        assert stage.group == group and stage.outcome == "hop_failed"
        assert "reply in the wrong shape" in (stage.error or "")


async def _stage(client, cid: str, lifecycle: str) -> MonitorRecord:
    async def record() -> MonitorRecord | None:
        return next(
            (
                r for r in await recent_events(client.redis, client.keys)
                if r.completion_id == cid and r.kind == "stage" and r.lifecycle == lifecycle
            ),
            None,
        )

    found = await wait_for(record, timeout=3)
    assert found is not None, f"no {lifecycle} stage record for {cid}"
    return found
