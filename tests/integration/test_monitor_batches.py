"""The `events` stream holds batches: one XADD per events shard per flush, read back by
`hookbus monitor`, `hookbus status` and the gateway's metrics, old one-record entries too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from hookbus.bus.connection.retrying import connect
from hookbus.bus.keys import Keys
from hookbus.bus.store.events import EventWriter
from hookbus.bus.wire.envelopes import MonitorRecord, encode, monitor_records
from hookbus.services.cli.monitor import RECENT_PAGE, follow_events, read_status, recent_events
from hookbus.services.gateway.metrics import FOLLOW_EVERY, EventsFollower, GatewayMetrics
from tests.waiting import wait_for


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator:
    client = connect(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def reader(redis_url: str) -> AsyncIterator:
    """For blocking reads: no retries, so cancelling a read stops it."""
    client = connect(redis_url, retries=0)
    yield client
    await client.aclose()


def record(completion_id: str, n: int, kind: str = "hop") -> MonitorRecord:
    return MonitorRecord(kind=kind, completion_id=completion_id, lifecycle=f"step{n}", group="g", duration_ms=n)  # type: ignore[arg-type]


async def test_one_flush_is_one_entry_per_events_shard_holding_its_records_in_order(redis, prefix):
    keys = Keys(prefix, shards=3)
    writer = EventWriter(redis, keys)
    emitted = [record(f"chatcmpl-{n % 7}", n) for n in range(40)]
    for one in emitted:
        writer.emit(one)
    calls_before = await _calls(redis, "xadd")
    await writer.flush()
    calls = await _calls(redis, "xadd") - calls_before
    shards_used = {keys.events_for(r.completion_id) for r in emitted}
    assert calls == len(shards_used) > 1
    for stream in keys.event_streams:
        entries = await redis.xrange(stream)
        expected = [r for r in emitted if keys.events_for(r.completion_id) == stream]
        assert len(entries) == (1 if expected else 0)
        if expected:
            assert monitor_records(entries[0][1]) == expected


async def test_the_monitor_reads_batches_and_one_record_entries_of_older_writers_in_time_order(redis, prefix):
    keys = Keys(prefix)
    old = record("chatcmpl-old", 1, kind="stage")
    batched = [record("chatcmpl-new", n) for n in range(2, 6)]
    await redis.xadd(keys.events, encode(old))  # a writer from before batching
    await redis.xadd(keys.events, {"e": "not json"})  # skipped, as before
    writer = EventWriter(redis, keys)
    for one in reversed(batched):  # emitted out of time order: readers sort by ts
        writer.emit(one)
    await writer.flush()
    assert await recent_events(redis, keys) == [old, *batched]
    assert await recent_events(redis, keys, count=2) == batched[-2:]
    status = await read_status(redis, keys)
    assert status.requests_last_minute == 0
    finished = MonitorRecord(kind="request", completion_id="chatcmpl-new", lifecycle="request", outcome="failed")  # type: ignore[arg-type]
    writer.emit(finished)
    await writer.flush()
    status = await read_status(redis, keys)
    assert (status.requests_last_minute, status.errors_last_minute) == (1, 1)


async def test_following_the_monitor_yields_every_record_of_every_new_entry(redis, reader, prefix):
    keys = Keys(prefix, shards=2)
    writer = EventWriter(redis, keys)
    writer.emit(record("before-start", 0))
    await writer.flush()
    emitted = [record(f"chatcmpl-{n}", n) for n in range(1, 30)]
    records = follow_events(reader, keys, from_start=True, block_ms=100)
    seen = [await anext(records)]
    for one in emitted[:10]:
        writer.emit(one)
    await writer.flush()
    await redis.xadd(keys.events_for("chatcmpl-old"), encode(emitted[10]))
    for one in emitted[11:]:
        writer.emit(one)
    await writer.flush()
    async with asyncio.timeout(5):
        while len(seen) <= len(emitted):
            seen.append(await anext(records))
    await records.aclose()
    assert seen[0].completion_id == "before-start"
    assert sorted(seen[1:], key=lambda r: r.duration_ms) == emitted


async def test_recent_events_pages_back_over_more_entries_than_one_read(redis, prefix):
    keys = Keys(prefix)
    writer = EventWriter(redis, keys)
    total = RECENT_PAGE * 2 + 50
    for n in range(total):  # one record per flush: one entry each
        writer.emit(record("chatcmpl-many", n))
        await writer.flush()
    assert await redis.xlen(keys.events) == total
    newest = await recent_events(redis, keys, count=RECENT_PAGE + 10)
    assert [r.duration_ms for r in newest] == list(range(total - RECENT_PAGE - 10, total))
    assert len(await recent_events(redis, keys, count=total * 2)) == total


async def test_the_gateway_metrics_observe_every_record_of_a_batch_and_of_an_old_entry(redis, reader, prefix):
    keys = Keys(prefix)
    metrics = GatewayMetrics()
    follower = EventsFollower(reader, keys, metrics)
    await follower.start()
    try:
        writer = EventWriter(redis, keys)
        for n in range(5):
            writer.emit(record("chatcmpl-m", n))
        writer.emit(MonitorRecord(kind="stage", completion_id="chatcmpl-m", lifecycle="on_message", group="g"))
        await writer.flush()
        await redis.xadd(keys.events, encode(record("chatcmpl-m", 9)))
        await redis.xadd(keys.events, {"x": "y"})  # not an envelope: skipped
        assert await wait_for(lambda: _events_read(metrics, 7), timeout=5)
    finally:
        await follower.stop()
    hops = [_sample(metrics, "hookbus_hops_total", group="g", lifecycle=f"step{n}", outcome="ok") for n in (0, 1, 2, 3, 4, 9)]
    assert hops == [1] * 6
    assert _sample(metrics, "hookbus_stages_total", lifecycle="on_message", group="g", outcome="ok") == 1


def _sample(metrics: GatewayMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def _events_read(metrics: GatewayMetrics, expected: float) -> bool:
    return _sample(metrics, "hookbus_gateway_events_read_total") == expected


@pytest.mark.parametrize(("cap", "per_flush"), [(2_000, 1), (20_000, 50)])
async def test_the_events_cap_counts_records_whatever_the_batch_size(redis, prefix, cap, per_flush):
    keys = Keys(prefix)
    writer = EventWriter(redis, keys, max_records=cap)
    for flush in range(3 * cap // per_flush):
        for n in range(per_flush):
            writer.emit(record(f"chatcmpl-{flush}", n))
        await writer.flush()
    stored = sum(len(monitor_records(fields)) for _, fields in await redis.xrange(keys.events))
    # approximate trimming removes whole stream nodes (100 entries): a little over the cap
    assert cap <= stored <= cap + 100 * per_flush


async def test_the_gateway_metrics_read_the_entries_of_many_flushes_at_once(redis, reader, prefix):
    keys = Keys(prefix)
    metrics = GatewayMetrics()
    follower = EventsFollower(reader, keys, metrics)
    await follower.start()
    flushes, every = 20, 0.025
    try:
        reads_before = await _calls(redis, "xread")
        writer = EventWriter(redis, keys)
        for n in range(flushes):  # a busy bus: a flush every 25 ms
            writer.emit(record("chatcmpl-busy", n))
            await writer.flush()
            await asyncio.sleep(every)
        assert await wait_for(lambda: _events_read(metrics, flushes), timeout=5)
        reads = await _calls(redis, "xread") - reads_before
    finally:
        await follower.stop()
    assert reads <= flushes * every / FOLLOW_EVERY + 3  # not one read per flush


async def _calls(redis, command: str) -> int:  # type: ignore[no-untyped-def]
    return int((await redis.info("commandstats")).get(f"cmdstat_{command}", {}).get("calls", 0))
