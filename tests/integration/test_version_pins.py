"""Version pins on a real Redis: a request's groups are pinned in its journal's `begin`,
a group that has versions only later is pinned with its hop's route in one journal
script, a pin the journal already holds (a recovered request's) wins for its group alone,
`serving:` counts the request under the version it is pinned to once published (and not
after its orchestrator stopped stamping it), and hops that belong to no request pin
nothing."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from hookbus import Agent, CompactionPolicy
from hookbus.bus.connection.cluster import keys_for
from hookbus.bus.connection.retrying import connect
from hookbus.bus.groups.registry import RegistryView
from hookbus.bus.groups.versions import PIN_STALE, RESTAMP_EVERY, serving_counts
from hookbus.bus.keys import Keys
from hookbus.bus.store.journal import Journal
from hookbus.services.orchestrator.serving import VersionPins
from hookbus.services.worker.host import GroupHost
from hookbus.services.worker.replica import WorkerReplica
from tests.conversations import conversation
from tests.integration.stack import running_stack
from tests.integration.test_compaction_remote import Noted
from tests.unit.test_versions import Guard


@contextlib.asynccontextmanager
async def two_groups(redis_url: str, prefix: str) -> AsyncIterator[tuple[Any, Keys, VersionPins, Journal]]:
    """Group alpha at version a1, beta at b1 and b2 (one replica each), and pins over
    them: (client, keys, pins, journal)."""
    keys = keys_for(redis_url, prefix)
    client = connect(redis_url)
    replicas = [
        WorkerReplica(GroupHost(group, [Guard()]), redis_url, prefix=prefix, replica=f"{group}-{version}", version=version)
        for group, version in (("alpha", "a1"), ("beta", "b1"), ("beta", "b2"))
    ]
    for replica in replicas:
        await replica.start()
    registry = RegistryView(client, keys)
    try:
        await registry.refresh()
        assert set(registry.versions["beta"]) == {"b1", "b2"}
        yield client, keys, VersionPins(client, keys, registry), Journal(client, keys)
    finally:
        for replica in replicas:
            await replica.stop()
        await client.aclose()


async def test_a_route_s_groups_are_pinned_together_and_the_journal_s_own_pin_wins(redis_url, prefix):
    async with two_groups(redis_url, prefix) as (client, keys, pins, journal):

        fresh = "chatcmpl-pins-fresh"
        await journal.begin(fresh, "1-0", "orch", now=0.0)
        await pins.pin(["alpha", "beta"], fresh)
        assert pins.pinned(fresh) == {"alpha": "a1", "beta": "b2"}  # beta's newest version
        stored = await journal.read(fresh)
        assert (stored["pin:alpha"], stored["pin:beta"]) == ("a1", "b2")
        assert await pins.version_for("beta", fresh) == "b2"  # no second pin: the one in memory

        recovered = "chatcmpl-pins-recovered"  # its crashed orchestrator had pinned beta to b1
        await journal.begin(recovered, "2-0", "orch", now=0.0)
        await client.hset(keys.journal(recovered), "pin:beta", "b1")
        await pins.pin(["alpha", "beta"], recovered)
        assert pins.pinned(recovered) == {"alpha": "a1", "beta": "b1"}
        assert (await journal.read(recovered))["pin:beta"] == "b1"

        unjournaled = "chatcmpl-pins-none"  # no journal: pinned in memory only
        await pins.pin(["beta"], unjournaled)
        assert pins.pinned(unjournaled) == {"beta": "b2"}
        assert await client.exists(keys.journal(unjournaled)) == 0

        assert await serving_counts(client, keys, "beta", ["b1", "b2"]) == {"b1": 0, "b2": 0}  # not published yet
        await pins.publish()
        assert await serving_counts(client, keys, "beta", ["b1", "b2"]) == {"b1": 1, "b2": 2}
        assert await serving_counts(client, keys, "alpha", ["a1"]) == {"a1": 2}
        for cid in (fresh, recovered, unjournaled):
            pins.release(cid)
        await pins.publish()
        assert await serving_counts(client, keys, "beta", ["b1", "b2"]) == {"b1": 0, "b2": 0}


async def test_a_request_is_pinned_in_its_journal_s_begin_and_counted_while_stamped(redis_url, prefix):
    async with two_groups(redis_url, prefix) as (client, keys, pins, journal):
        cid = "chatcmpl-pins-begin"
        fields = pins.choose_all()
        assert fields == {"pin:alpha": "a1", "pin:beta": "b2"}
        assert (await journal.begin(cid, "1-0", "orch", now=0.0, fields=fields)).ok
        pins.adopt(cid, fields)
        stored = await journal.read(cid)
        assert (stored["pin:alpha"], stored["pin:beta"], stored["epoch"]) == ("a1", "b2", "1")

        # a route's pins are taken already: no pin script runs (it would store them again)
        await client.hdel(keys.journal(cid), "pin:alpha", "pin:beta")
        await pins.pin(["alpha", "beta"], cid)
        assert await pins.stream_for("beta", cid) == keys.pinned_hooks_for("beta", "b2", cid)
        assert "pin:beta" not in await journal.read(cid)

        # another orchestrator's pin that nobody stamped for longer than PIN_STALE (it died)
        gone = "chatcmpl-pins-gone"
        await client.zadd(keys.serving("beta", "b2"), {gone: time.time() - PIN_STALE - 1})
        await pins.publish()
        assert await serving_counts(client, keys, "beta", ["b2"]) == {"b2": 1}  # ours, not the stale one
        assert await client.zscore(keys.serving("beta", "b2"), gone) is not None
        first = await client.zscore(keys.serving("beta", "b2"), cid)

        pins._restamped -= RESTAMP_EVERY  # time to stamp every running request again
        await pins.publish()
        assert await client.zscore(keys.serving("beta", "b2"), cid) > first
        assert await client.zscore(keys.serving("beta", "b2"), gone) is None  # dropped with the restamp

        pins.release(cid)
        await pins.publish()
        assert await serving_counts(client, keys, "alpha", ["a1"]) == {"a1": 0}
        assert await serving_counts(client, keys, "beta", ["b2"]) == {"b2": 0}


async def test_a_compaction_between_turns_sent_on_from_group_to_group_pins_no_version(redis_url, prefix):
    """Its hops belong to no request, so nothing would release a pin: neither its first
    hop nor the route its worker sends the stage on along pins a version."""
    agent = Agent("bus", compaction_policy=CompactionPolicy(window=1000))
    first, second = Noted("first-noted"), Noted("second-noted")
    async with running_stack(redis_url, prefix, agent, {"first": [first], "second": [second]}) as (client, services, _):
        outcome = await agent.compact(conversation(3))
        runtime = services[0].runtime
        assert runtime is not None and runtime.forwarded == 1  # the stage was sent on to `second`
        cid = f"compaction-{outcome.id}"
        assert first.calls == second.calls == [(outcome.id, True, cid)]
        assert runtime.pins.pinned(cid) == {}
        for group in ("first", "second"):
            versions = list(runtime.registry.versions[group])
            assert versions and await serving_counts(client.redis, client.keys, group, versions) == dict.fromkeys(versions, 0)
