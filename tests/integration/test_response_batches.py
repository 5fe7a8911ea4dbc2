"""Response items batched in the response stream: one entry per journal write, read item
by item, in order, next to the bare single-item entries older writers wrote."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from hookbus.bus.client import HookbusClient
from hookbus.bus.keys import ORCHESTRATOR_GROUP
from hookbus.bus.store.journal import FENCED, Journal
from hookbus.bus.store.response_stream import Ack, Fence, ResponseWriter
from hookbus.bus.wire.envelopes import (
    RequestEnvelope,
    ResponseItem,
    encode,
    encode_response_batch,
    response_items,
)
from tests.waiting import wait_for

GROUP = ORCHESTRATOR_GROUP


def chunk(cid: str, text: str) -> ResponseItem:
    return ResponseItem(kind="chunk", completion_id=cid, chunk={"text": text})


def texts(items: list[ResponseItem]) -> list[str]:
    return [item.kind if item.chunk is None else item.chunk["text"] for item in items]


@pytest.fixture
async def client(redis_url: str, prefix: str) -> AsyncIterator[HookbusClient]:
    async with HookbusClient(redis_url, prefix=prefix, timeout=10) as client:
        yield client


async def begun(client: HookbusClient) -> tuple[Journal, str, str]:
    """A journal begun for a new request (epoch 1) whose entry is delivered to us: (journal,
    completion id, entry id)."""
    cid = f"chatcmpl-{uuid.uuid4().hex[:12]}"
    requests = client.keys.requests_for(cid)
    entry = (await client.redis.xadd(requests, {"e": b"{}"})).decode()
    await client.redis.xgroup_create(requests, GROUP, id="0")
    await client.redis.xreadgroup(GROUP, "me", {requests: ">"})
    journal = Journal(client.redis, client.keys)
    assert (await journal.begin(cid, entry, "me", now=time.time())).ok
    return journal, cid, entry


async def is_gone(client: HookbusClient, key: str) -> bool:
    return not await client.redis.exists(key)


async def read_all(client: HookbusClient, cid: str) -> list[ResponseItem]:
    request = RequestEnvelope(completion_id=cid, messages=[{"role": "user", "content": "hi"}])
    return [item async for item in client.items(request)]


async def test_a_multi_item_write_is_one_entry_and_the_client_reads_each_item_in_order(client):
    journal, cid, entry = await begun(client)
    stream = client.keys.responses(cid)
    writer = ResponseWriter(client.redis, stream, fence=Fence(journal, cid, 1))
    for word in ("one", "two", "three"):  # in one turn of the loop: one batch
        writer.add(chunk(cid, word))
    assert await wait_for(lambda: client.redis.exists(stream))
    writer.add(chunk(cid, "four"))
    assert await writer.finish(
        ResponseItem(kind="done", completion_id=cid), ack=Ack(client.keys.requests_for(cid), GROUP, entry)
    )

    entries = await client.redis.xrange(stream)
    # "four" came within the linger after the first batch: it goes with the terminal item
    assert [texts(response_items(fields)) for _id, fields in entries] == [["one", "two", "three"], ["four", "done"]]
    assert (await journal.read(cid))["written"] == "5"  # items, not entries
    assert await journal.written(cid) == 5
    assert texts(await read_all(client, cid)) == ["one", "two", "three", "four", "done"]
    # read to its terminal item, the client deletes it with the others read meanwhile
    assert await wait_for(lambda: is_gone(client, stream))


async def test_chunks_within_the_linger_after_a_batch_go_out_together_and_the_first_at_once(client):
    journal, cid, entry = await begun(client)
    stream = client.keys.responses(cid)
    writer = ResponseWriter(client.redis, stream, fence=Fence(journal, cid, 1), linger=1.0)
    began = time.monotonic()
    writer.add(chunk(cid, "first"), at_once=True)
    assert await wait_for(lambda: client.redis.exists(stream), every=0.005)
    assert time.monotonic() - began < 0.5  # not held back
    for word in ("a", "b", "c"):  # apart, each within the linger after the first batch
        await asyncio.sleep(0.05)
        writer.add(chunk(cid, word))
    assert await client.redis.xlen(stream) == 1

    async def two_entries() -> bool:
        return await client.redis.xlen(stream) == 2

    assert await wait_for(two_entries)
    assert time.monotonic() - began >= 1.0
    writer.add(chunk(cid, "d"))  # held, and then handed to finish with the terminal item
    assert await writer.finish(
        ResponseItem(kind="done", completion_id=cid), ack=Ack(client.keys.requests_for(cid), GROUP, entry)
    )
    assert time.monotonic() - began < 1.5  # finish did not wait out the linger
    entries = await client.redis.xrange(stream)
    assert [texts(response_items(fields)) for _id, fields in entries] == [["first"], ["a", "b", "c"], ["d", "done"]]


async def test_an_item_added_at_once_does_not_wait_out_the_linger_and_takes_what_waited_with_it(client):
    journal, cid, entry = await begun(client)
    stream = client.keys.responses(cid)
    writer = ResponseWriter(client.redis, stream, fence=Fence(journal, cid, 1), linger=5.0)
    began = time.monotonic()
    writer.add(chunk(cid, "role only"))  # waits: the first item too
    await asyncio.sleep(0.1)
    assert not await client.redis.exists(stream)
    writer.add(chunk(cid, "first text"), at_once=True)
    assert await wait_for(lambda: client.redis.exists(stream), every=0.005)
    assert time.monotonic() - began < 2.5
    assert await writer.finish(
        ResponseItem(kind="done", completion_id=cid), ack=Ack(client.keys.requests_for(cid), GROUP, entry)
    )
    entries = await client.redis.xrange(stream)
    assert [texts(response_items(fields)) for _id, fields in entries] == [["role only", "first text"], ["done"]]


async def test_entries_of_one_bare_item_still_read_between_batches(client):
    cid = "chatcmpl-old-and-new"
    stream = client.keys.responses(cid)
    await client.redis.xadd(stream, encode(chunk(cid, "old one")))  # type: ignore[arg-type]
    await client.redis.xadd(stream, {"e": encode_response_batch([chunk(cid, "new one"), chunk(cid, "new two")])})
    await client.redis.xadd(stream, encode(chunk(cid, "old two")))  # type: ignore[arg-type]
    await client.redis.xadd(stream, encode(ResponseItem(kind="done", completion_id=cid)))  # type: ignore[arg-type]
    assert texts(await read_all(client, cid)) == ["old one", "new one", "new two", "old two", "done"]


async def test_a_terminal_item_at_the_end_of_a_batch_ends_the_read(client):
    cid = "chatcmpl-terminal-in-batch"
    stream = client.keys.responses(cid)
    error = ResponseItem(kind="error", completion_id=cid, error={"status_code": 402, "code": "pay", "message": "pay"})
    await client.redis.xadd(stream, {"e": encode_response_batch([chunk(cid, "a"), chunk(cid, "b"), error])})
    await client.redis.xadd(stream, {"e": encode_response_batch([chunk(cid, "never read")])})
    assert texts(await read_all(client, cid)) == ["a", "b", "error"]


async def test_a_malformed_batch_is_dead_lettered_and_skipped_as_a_whole(client):
    cid = "chatcmpl-bad-batch"
    stream = client.keys.responses(cid)
    good = chunk(cid, "kept").model_dump_json()
    await client.redis.xadd(stream, {"e": f'{{"v": 1, "kind": "batch", "items": [{good}, {{"kind": "nope"}}]}}'})
    await client.redis.xadd(stream, {"e": '{"v": 1, "kind": "batch", "items": []}'})
    await client.redis.xadd(stream, {"e": encode_response_batch([chunk(cid, "after"), ResponseItem(kind="done", completion_id=cid)])})
    assert texts(await read_all(client, cid)) == ["after", "done"]
    dead = [fields for _id, fields in await client.redis.xrange(client.keys.dead_letter)]
    assert [fields[b"source"] for fields in dead] == [stream.encode()] * 2
    assert b"items.1.kind" in dead[0][b"reason"] and b"items" in dead[1][b"reason"]


async def test_a_retried_write_or_finish_stores_no_item_twice(client):
    journal, cid, entry = await begun(client)
    stream, requests = client.keys.responses(cid), client.keys.requests_for(cid)
    batch = [chunk(cid, "a"), chunk(cid, "b")]
    assert await journal.write(cid, stream, 1, batch, ttl=60, first_seq=0) == 2
    assert await journal.write(cid, stream, 1, batch, ttl=60, first_seq=0) == 2  # its reply was lost
    last = [chunk(cid, "c"), ResponseItem(kind="done", completion_id=cid)]
    for _attempt in range(2):
        assert await journal.finish(cid, stream, 1, last, ttl=60, requests=requests, group=GROUP, entry_id=entry, first_seq=2) == 4
    assert [texts(response_items(fields)) for _id, fields in await client.redis.xrange(stream)] == [["a", "b"], ["c", "done"]]


async def test_an_entry_the_writer_did_not_number_is_appended_after_not_taken_for_a_retry(client):
    journal, cid, entry = await begun(client)
    stream, requests = client.keys.responses(cid), client.keys.requests_for(cid)
    await client.redis.xadd(stream, {"e": encode_response_batch([chunk(cid, "foreign")])})
    assert await journal.write(cid, stream, 1, [chunk(cid, "a")], ttl=60, first_seq=0) == 1
    done = ResponseItem(kind="done", completion_id=cid)
    assert await journal.finish(cid, stream, 1, [done], ttl=60, requests=requests, group=GROUP, entry_id=entry, first_seq=1) == 2
    assert [texts(response_items(fields)) for _id, fields in await client.redis.xrange(stream)] == [["foreign"], ["a"], ["done"]]
    assert 0 < await client.redis.ttl(stream) <= 60


async def test_an_owner_that_lost_the_epoch_writes_no_batch(client):
    journal, cid, entry = await begun(client)
    stream, requests = client.keys.responses(cid), client.keys.requests_for(cid)
    assert await journal.write(cid, stream, 1, [chunk(cid, "a")], ttl=60, first_seq=0) == 1
    assert (await journal.claim(cid, entry, "other", now=time.time())).epoch == 2
    assert await journal.write(cid, stream, 1, [chunk(cid, "b"), chunk(cid, "c")], ttl=60, first_seq=1) == FENCED
    done = ResponseItem(kind="done", completion_id=cid)
    assert await journal.finish(cid, stream, 1, [done], ttl=60, requests=requests, group=GROUP, entry_id=entry, first_seq=1) == FENCED
    assert await client.redis.xlen(stream) == 1
    assert await journal.finish(cid, stream, 2, [done], ttl=60, requests=requests, group=GROUP, entry_id=entry) == 2


async def test_begin_still_sees_a_cancel_marker_and_its_own_retry(client):
    cid = "chatcmpl-begin"
    journal = Journal(client.redis, client.keys)
    await client.redis.set(client.keys.cancel(cid), "1")
    first = await journal.begin(cid, "1-0", "me", now=time.time())
    assert first.ok and first.cancelled
    retried = await journal.begin(cid, "1-0", "me", now=time.time())
    assert retried.ok and retried.cancelled and retried.epoch == 1
    other = await journal.begin(cid, "2-0", "me", now=time.time())
    assert not other.ok and other.entry == "1-0"
    fresh = await journal.begin("chatcmpl-begin-2", "3-0", "me", now=time.time())
    assert fresh.ok and not fresh.cancelled
