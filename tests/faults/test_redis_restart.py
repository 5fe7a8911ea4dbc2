"""Redis restarts under load (an embedded redis-server with AOF, of this test's own):
every request ends, finalize ran for each, and the services work on afterwards; a worker
group whose replicas had no chance to beat again since Redis came back still gets its hops
(its finalize_connection hook runs once per request)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aredis

from hookbus.bus.groups.registry import REPLICA_TTL, GroupAnnouncement, announce
from hookbus.bus.keys import ORCHESTRATOR_GROUP, Keys
from tests.faults.fault_skills import fault_key
from tests.faults.helpers import finalize_log, pending, read_until_terminal, submit, version_stream
from tests.faults.test_observer_faults import WATCHER, observed
from tests.integration.processes import Processes
from tests.waiting import wait_for

AGENT = "tests.faults.fault_skills:agent"
GROUP_SKILLS = ("tests.faults.fault_skills:Ledger", "tests.faults.fault_skills:Touch")

pytestmark = pytest.mark.slow


async def test_services_ride_out_a_redis_restart_and_every_request_ends(own_redis, service_env, tmp_path, prefix):
    env = dict(service_env, REDIS_URL=own_redis.url)
    procs = Processes(env, tmp_path / "logs")
    client = aredis.Redis.from_url(own_redis.url)
    keys = Keys(prefix)
    try:
        workers = [procs.worker("alpha", *GROUP_SKILLS, replica=f"alpha-{n}", claim_idle=1) for n in range(2)]
        orchestrators = [procs.orchestrator(AGENT, instance=f"orch-{n}", claim_idle=1) for n in range(2)]
        await procs.wait_ready(*workers, *orchestrators)

        first = [f"chatcmpl-before-{n}-{uuid.uuid4().hex[:6]}" for n in range(30)]
        for n, cid in enumerate(first):
            text = "[[words:20]] [[delay:50]]" if n % 2 else "[[delay:600]] [[echo]] patient"
            await submit(client, keys, text, completion_id=cid, stream=bool(n % 2), timeout=90)
        readers = [asyncio.create_task(read_until_terminal(client, keys, cid, timeout=90)) for cid in first]

        async def in_flight() -> bool:  # read by the orchestrators, not yet answered (each takes >= 0.6 s)
            return await pending(client, keys.requests, ORCHESTRATOR_GROUP) >= len(first) // 3

        assert await wait_for(in_flight, timeout=10), procs.logs()
        await asyncio.to_thread(own_redis.restart, down_for=1.5)

        outcomes = await asyncio.gather(*readers)
        unfinished = [o.completion_id for o in outcomes if o.terminal is None]
        assert not unfinished, procs.logs()
        finalized = [int(await client.get(fault_key("finalize", cid, prefix=prefix)) or 0) for cid in first]
        assert all(f >= 1 for f in finalized), (finalized, procs.logs())
        ok = sum(o.error is None for o in outcomes)
        errors = sorted({(o.error["status_code"], o.error["code"]) for o in outcomes if o.error})

        # the services reconnected: new requests run normally
        after = [f"chatcmpl-after-{n}-{uuid.uuid4().hex[:6]}" for n in range(10)]
        for cid in after:
            await submit(client, keys, "[[echo]] back to normal", completion_id=cid, timeout=60)
        later = await asyncio.gather(*(read_until_terminal(client, keys, cid, timeout=60) for cid in after))
        assert all(o.terminal is not None and o.terminal.kind == "done" for o in later), [o.terminal for o in later]
        assert all(o.text == "back to normal" for o in later)
        assert all(p.alive for p in procs.procs), procs.logs()

        async def all_acked() -> bool:  # each request is acked right after its terminal item
            return await pending(client, keys.requests, ORCHESTRATOR_GROUP) == 0

        assert await wait_for(all_acked, timeout=5)
        print(f"redis restart: {ok}/{len(first)} in-flight requests succeeded; errors: {errors}")
    finally:
        procs.close()
        await client.aclose()


async def test_a_group_not_yet_beating_after_a_long_restart_still_runs_its_finalize(own_redis, service_env, tmp_path, prefix):
    """Redis down for longer than a heartbeat's TTL, and the worker group's replica slower to
    beat again than the orchestrator is to take requests (on the busy machine of `make
    deploy-check`, a RequestLogger's finalize was lost so): the orchestrator still sends the
    group its hops, which run once the replica is back, so finalize_connection's hook runs
    exactly once per request. Before, the group looked dead and its hooks were skipped."""
    env = dict(service_env, REDIS_URL=own_redis.url)
    procs = Processes(env, tmp_path / "logs")
    client = aredis.Redis.from_url(own_redis.url)
    keys = Keys(prefix)
    try:
        worker = procs.worker("alpha", *GROUP_SKILLS, replica="alpha-0")
        orchestrator = procs.orchestrator(AGENT, instance="orch-0")
        await procs.wait_ready(worker, orchestrator)

        worker.pause()  # no heartbeat from here until it resumes
        await asyncio.to_thread(own_redis.restart, down_for=REPLICA_TTL + 1)
        # A registry change after the restart: once the orchestrator logged that it loaded
        # it, its view of who is live was read from the restarted Redis (until then it may
        # still hold the one from before the restart).
        await announce(client, keys, GroupAnnouncement(group="beta"))

        async def view_reloaded() -> bool:
            lines = orchestrator.log_path.read_text(errors="replace").splitlines()
            return any("registry_loaded" in line and '"version": 2' in line for line in lines)

        assert await wait_for(view_reloaded, timeout=30), procs.logs()
        ids = [f"chatcmpl-late-beat-{n}-{uuid.uuid4().hex[:6]}" for n in range(4)]
        for cid in ids:
            await submit(client, keys, "[[echo]] right after the restart", completion_id=cid, stream=False, timeout=90)

        stream = await version_stream(client, keys, "alpha")

        async def hops_waiting() -> bool:  # each request's on_connection hop to alpha, sent
            return int(await client.xlen(stream)) >= len(ids)

        sent = await wait_for(hops_waiting, timeout=20)
        worker.resume()
        outcomes = await asyncio.gather(*(read_until_terminal(client, keys, cid, timeout=90) for cid in ids))
        assert all(o.terminal is not None and o.error is None for o in outcomes), ([o.terminal for o in outcomes], procs.logs())
        assert sent, "the orchestrator sent no hop to the group whose replica had not beaten since the restart"
        runs = [await finalize_log(client, prefix, cid, counter="wfinalize") for cid in ids]
        assert [len(r) for r in runs] == [1] * len(ids), (runs, procs.logs())
    finally:
        procs.close()
        await client.aclose()


async def test_observations_of_requests_ending_across_a_restart_reach_their_observers(own_redis, service_env, tmp_path, prefix):
    """Requests whose model call runs while Redis restarts end after it, so their observation
    entries go out on a pooled connection the restart closed, or while Redis still refuses:
    each is sent again, and every request's finalize_connection is observed exactly once.
    Before, the first failure lost the entry (`observations_not_sent`): a RequestLogger
    observer's finalize line was missing on the compose stack of `make deploy-check`."""
    env = dict(service_env, REDIS_URL=own_redis.url)
    procs = Processes(env, tmp_path / "logs")
    client = aredis.Redis.from_url(own_redis.url)
    keys = Keys(prefix)
    try:
        watcher = procs.worker("watch", WATCHER, replica="watch-0")
        orchestrator = procs.orchestrator(AGENT, instance="orch-0")
        await procs.wait_ready(watcher, orchestrator)
        ids = [f"chatcmpl-observed-{n}-{uuid.uuid4().hex[:6]}" for n in range(8)]
        for n, cid in enumerate(ids):
            await submit(client, keys, f"[[delay:{300 + 100 * n}]] [[words:10]] slow", completion_id=cid, timeout=90)

        async def in_flight() -> bool:
            return await pending(client, keys.requests, ORCHESTRATOR_GROUP) == len(ids)

        assert await wait_for(in_flight, timeout=20), procs.logs()
        await asyncio.to_thread(own_redis.restart, down_for=2.0)
        outcomes = await asyncio.gather(*(read_until_terminal(client, keys, cid, timeout=90) for cid in ids))
        assert all(o.terminal is not None for o in outcomes), procs.logs()

        async def finalize_observed() -> list[int]:
            seen = [await observed(client, prefix, cid) for cid in ids]
            return [sum(o["lifecycle"] == "finalize_connection" for o in s) for s in seen]

        async def all_observed() -> bool:
            return all(await finalize_observed())

        await wait_for(all_observed, timeout=30)
        assert await finalize_observed() == [1] * len(ids), procs.logs()
    finally:
        procs.close()
        await client.aclose()
