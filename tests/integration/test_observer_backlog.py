"""An observer group's backlog is bounded (hookbus.bus.groups.observer_backlog): a stopped
group's stream stays within its bound in entries and bytes, what was dropped is counted in
`hookbus status`, the gateway's metrics and the console; a live group within its bound
receives every request's observations, and a replica that comes back reads what was kept."""

from __future__ import annotations

from typing import Any

from hookbus import Agent
from hookbus.bus.connection.retrying import connect
from hookbus.bus.groups.observer_backlog import BacklogBound, bound_stream
from hookbus.bus.keys import Keys
from hookbus.services.cli.monitor import format_status, read_status
from hookbus.services.console.data import ConsoleData
from hookbus.services.gateway.metrics import GatewayMetrics
from hookbus.services.worker.host import GroupHost
from hookbus.services.worker.replica import WorkerReplica
from hookbus.skills import Context, HookData, Skill, hook
from tests.integration.stack import running_stack
from tests.waiting import wait_for

BOUND = BacklogBound(max_entries=8, max_bytes=160_000)
CHECK_EVERY = 0.2
PROMPT = "x" * 20_000
"""Each request's observation entry holds its prompt: about 20 kB, so the bytes bind first."""
STOPPED_REQUESTS = 30
LIVE_BATCH = 2


class Watch(Skill):
    """An observer of each request's end; keeps the completion ids it saw."""

    name = "watch"

    def __init__(self) -> None:
        self.seen: list[str] = []

    @hook("finalize_connection", observe=True)
    async def ended(self, data: HookData, ctx: Context) -> None:
        self.seen.append(ctx.completion_id)

    async def saw(self, completion_ids: list[str]) -> bool:
        return set(completion_ids) <= set(self.seen)


async def test_a_stopped_observer_group_keeps_within_its_bound_and_counts_what_it_dropped(
    redis_url: str, prefix: str
) -> None:
    watch = Watch()
    keys = Keys(prefix)
    (stream,) = keys.observe_streams("watch")
    options: dict[str, Any] = {"observe_bound": BOUND, "backlog_every": CHECK_EVERY}
    async with running_stack(
        redis_url, prefix, Agent("bounded"), {"watch": [watch]}, orchestrator_options=options
    ) as (client, services, workers):
        redis = client.redis

        # live and within its bound: more requests than the bound's entries, every one observed
        # (a few at a time: the replica reads its stream once a second, hookbus.services.worker.observer)
        live: list[str] = []
        for batch in range(2 * BOUND.max_entries // LIVE_BATCH):
            live += [(await client.complete(f"hello {batch}.{n} {PROMPT}")).id for n in range(LIVE_BATCH)]
            assert await wait_for(lambda sent=list(live): watch.saw(sent), timeout=15), "a live group missed some"
        assert sorted(watch.seen) == sorted(live)  # each once
        assert await redis.hget(keys.observe_dropped, "watch") is None

        # stopped: its stream is kept within the bound, the oldest observations dropped
        await workers[0].stop()
        stopped = [(await client.complete(f"later {n} {PROMPT}")).id for n in range(STOPPED_REQUESTS)]

        async def within() -> bool:
            await services[0].bound_observer_backlogs()  # what the periodic check does, now
            entries = await redis.xlen(stream)
            size = await redis.memory_usage(stream, samples=0)
            return entries <= BOUND.max_entries and size <= BOUND.max_bytes

        assert await wait_for(within, timeout=15)
        kept = await redis.xlen(stream)
        assert 0 < kept < STOPPED_REQUESTS
        dropped = int(await redis.hget(keys.observe_dropped, "watch"))
        assert dropped + kept == STOPPED_REQUESTS  # every observation kept or counted, none twice
        dropped_bytes = int(await redis.hget(keys.observe_dropped, "watch:bytes"))
        assert dropped_bytes >= dropped * len(PROMPT)

        # counted where an operator looks: hookbus status (text and JSON), /metrics, the console
        status = await read_status(redis, keys)
        (group,) = [g for g in status.groups if g.name == "watch"]
        assert (group.observe_dropped, group.observe_dropped_bytes) == (dropped, dropped_bytes)
        assert f"DROPPED {dropped} ({dropped_bytes:,} bytes" in format_status(status)
        assert f'"observe_dropped": {dropped}' in status.model_dump_json(indent=2)
        exposition = (await GatewayMetrics().scrape(redis, keys)).decode()
        assert f'hookbus_observations_dropped{{group="watch"}} {float(dropped)}' in exposition
        console = ConsoleData(redis, keys)
        try:
            (view,) = [g for g in (await console.snapshot()).bus.groups if g.name == "watch"]
        finally:
            await console.stop()
        assert view.observe_dropped == dropped and not view.live

        # a replica back: it reads the newest observations that were kept, no gone entry
        pending: Any = await redis.xpending(stream, "watch")
        assert pending["pending"] == 0  # what was trimmed from the pending list was acked with it
        back = WorkerReplica(GroupHost("watch", [watch]), redis_url, prefix=prefix, replica="watch-back")
        await back.start()
        try:
            newest = stopped[-kept:]
            assert await wait_for(lambda: watch.saw(newest), timeout=15)
            assert not set(stopped[:-kept]) & set(watch.seen)
        finally:
            await back.stop()
    probe = connect(redis_url)
    try:
        assert int(await probe.hget(keys.observe_dropped, "watch")) == dropped  # nothing more dropped
    finally:
        await probe.aclose()


async def test_the_bound_takes_pending_entries_only_past_it_and_acks_what_it_took(redis_url: str, prefix: str) -> None:
    """A replica that read entries and hangs (they stay pending): within the bound nothing
    it holds is trimmed; past it the oldest go, out of its pending list too. A stream no
    replica ever read (no consumer group) is bounded the same way."""
    redis = connect(redis_url)
    try:
        read, unread = f"{prefix}observe:hung", f"{prefix}observe:never"
        await redis.xgroup_create(read, "hung", id="0", mkstream=True)
        ids = [await redis.xadd(read, {"e": f"entry {n}"}) for n in range(20)]
        await redis.xreadgroup("hung", "replica-a", {read: ">"}, count=20)  # read, never acked
        for n in range(20):
            await redis.xadd(unread, {"e": f"entry {n}"})

        within = await bound_stream(redis, read, BacklogBound(max_entries=20, max_bytes=10**9))
        assert (within.dropped, within.entries) == (0, 20)
        assert (await redis.xpending(read, "hung"))["pending"] == 20  # within the bound: nothing taken

        dropped = await bound_stream(redis, read, BacklogBound(max_entries=5, max_bytes=10**9))
        assert (dropped.dropped, dropped.entries) == (15, 5) and dropped.dropped_bytes > 0
        pending: Any = await redis.xpending(read, "hung")
        assert pending["pending"] == 5 and pending["min"] == ids[15]  # the newest 5 stay pending
        assert [e for e, _ in await redis.xrange(read)] == ids[15:]

        assert (await bound_stream(redis, unread, BacklogBound(max_entries=5, max_bytes=10**9))).dropped == 15
        assert await redis.xlen(unread) == 5
    finally:
        await redis.aclose()
