"""The console's reader: shared by every viewer, silent when nobody watches, still there
after Redis went away and came back, and telling how long each replica has been up."""

from __future__ import annotations

import asyncio
import time

import pytest

from hookbus.bus.connection.embedded import EmbeddedRedis
from hookbus.bus.connection.retrying import connect
from hookbus.bus.groups.registry import GroupAnnouncement, announce, heartbeat
from hookbus.bus.groups.versions import ReplicaInfo, publish
from hookbus.bus.keys import Keys
from hookbus.bus.wire.envelopes import REQUEST_START, MonitorRecord
from hookbus.services.console.data import POLL_EVERY, ConsoleData, RequestTrack
from tests.waiting import wait_for


async def test_viewers_share_one_poll_and_the_poller_stops_when_nobody_watches(redis_url: str, prefix: str) -> None:
    client = connect(redis_url, retries=0)
    data = ConsoleData(client, Keys(prefix), idle_after=0.5)
    try:
        first, second = await asyncio.gather(data.snapshot(), data.snapshot())
        assert first is second  # two viewers, one read
        assert data.polling

        async def stopped() -> bool:
            return not data.polling

        assert await wait_for(stopped, timeout=5)
        await asyncio.sleep(2.5)  # more than a poll interval
        assert not data.polling
        again = await data.snapshot()  # a viewer wakes it, and gets a fresh read, not the old one
        assert data.polling and again.bus.at > first.bus.at + 2.5
    finally:
        await data.stop()
        await client.aclose()


async def test_the_console_rides_out_a_redis_restart(tmp_path, prefix: str) -> None:
    server = EmbeddedRedis(directory=tmp_path / "redis", appendonly=True)
    client = connect(server.start(), retries=0)
    data = ConsoleData(client, Keys(prefix))
    try:
        before = await data.snapshot()
        await asyncio.to_thread(server.restart, down_for=POLL_EVERY * 2)  # polls fail meanwhile
        assert data.polling  # the poller logged the failures and went on
        after = await asyncio.wait_for(data.next_snapshot(before), timeout=POLL_EVERY * 5)
        assert after.bus.at > before.bus.at + POLL_EVERY * 2
    finally:
        await data.stop()
        await client.aclose()
        server.cleanup()



async def test_a_replica_is_up_for_as_long_as_it_says_and_seen_for_when_it_does_not(redis_url: str, prefix: str) -> None:
    """One replica started an hour before this console first looked; one (a worker that
    writes no version record) says nothing, so only how long it has been seen is known."""
    client = connect(redis_url, retries=0)
    keys = Keys(prefix)
    await announce(client, keys, GroupAnnouncement(group="old"))
    started = time.time() - 3600
    await publish(client, keys, "old", "old-0", ReplicaInfo(version="1", hooks="h", started=started))
    for replica in ("old-0", "old-1"):
        await heartbeat(client, keys, "old", replica)
    data = ConsoleData(client, keys)
    try:
        bus = (await data.snapshot()).bus
        (group,) = bus.groups
        told, silent = group.replicas
        assert told.name == "old-0" and told.up_for == pytest.approx(bus.at - started, abs=0.01)
        assert told.seen_for < 60  # the console itself has seen it only now
        assert silent.name == "old-1" and silent.up_for is None and 0 <= silent.seen_for < 60
    finally:
        await data.stop()
        await client.aclose()


def test_an_ended_request_view_is_kept_until_a_late_record_of_it_arrives() -> None:
    """A worker's last hop record can reach the events stream after the orchestrator's end
    record: the kept view of the ended request must take it in."""
    track = RequestTrack("chatcmpl-late")
    track.add(MonitorRecord(completion_id="chatcmpl-late", lifecycle=REQUEST_START, model="m", caller="c", ts=100.0))
    assert (track.view(101.0).outcome, track.view(101.0).model, track.view(101.0).caller) == ("running", "m", "c")
    track.add(MonitorRecord(kind="hop", completion_id="chatcmpl-late", lifecycle="on_connection", group="a", ts=100.5))
    track.add(MonitorRecord(kind="request", completion_id="chatcmpl-late", lifecycle="request", status=200, ts=102.0, duration_ms=2000))
    ended = track.view(103.0)
    assert (ended.outcome, ended.groups, ended.started) == ("ok", ["a"], 100.0)
    assert track.view(104.0) is ended  # kept: an ended request's view does not change with time
    track.add(MonitorRecord(kind="hop", completion_id="chatcmpl-late", lifecycle="finalize_connection", group="b", ts=102.1))
    assert track.view(105.0).groups == ["a", "b"]
