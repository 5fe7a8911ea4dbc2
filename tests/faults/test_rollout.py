"""A rolling upgrade of a worker group under load (`make check-rollout`).

Streamed and tool requests go through the gateway (the real `openai` client) while each
of the three v1 replicas of the group `tagger` is replaced, one at a time, by a v2
replica whose hooks tag the data differently (tests/faults/rollout_skills.py): the first
replaced is one holding a hop of a long v1 stream, and gets SIGKILL (its held hops are
claimed by a v1 sibling), the second SIGTERM (it drains while a v1 sibling serves on),
the last SIGTERM (the last of v1, it serves the requests pinned to v1, the long streams,
until none is left). Then:

- no request failed;
- no request carries two versions' tags, nor did two versions' hooks run for it (the
  hooks record each request's versions in Redis), its journal holds that version as its
  pin, and each version served some;
- every request was finalized (its finalize_connection hook recorded it);
- each old replica was gone from `hookbus status` within seconds of its last hop or of
  its SIGTERM, whichever came later (a replica idles once new requests go to the newer
  version: its last hop may come well before it is told to stop), or once its heartbeat
  expired (the one killed);
- `hookbus status --json` shows the group at v2 alone, each replica with its version.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import time
from dataclasses import dataclass

import openai
import pytest

from hookbus.bus.groups.registry import REPLICA_TTL
from hookbus.services.cli.monitor import read_status, recent_events
from tests.faults.fault_skills import fault_key
from tests.integration.processes import REPO, free_port
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

GROUP = "tagger"
SKILL = "tests.faults.rollout_skills:Tagger"
AGENT = "tests.faults.rollout_skills:agent"
KEY = "sk-rollout-caller-0123456789"
CLIENTS = 4
DRAINED_GONE_WITHIN = 3.0
"""Seconds from a drained replica's last hop (or its SIGTERM) to its absence from `hookbus status`."""
TAG = re.compile(r"\[(v\d)\]")


@dataclass
class Answer:
    kind: str
    completion_id: str | None
    text: str
    error: str | None = None


async def streamed(client: openai.AsyncOpenAI, n: int) -> Answer:
    stream = await client.chat.completions.create(
        model="offline", stream=True,
        messages=[{"role": "user", "content": f"[[words:8]] [[delay:25]] s{n}"}],
    )
    text, cid = "", None
    async for chunk in stream:
        cid = chunk.id
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    return Answer("stream", cid, text)


async def long_stream(client: openai.AsyncOpenAI, n: int) -> Answer:
    """A stream pinned to v1 that outlasts most of the rollout: 40 chunks, each held
    by the tagger (rollout_skills.SLOWLY) and spaced by the model, held on until the first
    v1 replica is killed (`test:hold`)."""
    words = " ".join(f"x{k}" for k in range(39))
    stream = await client.chat.completions.create(
        model="offline", stream=True,
        messages=[{"role": "user", "content": f"[[echo]] [[delay:200]] slowly {words} l{n}"}],
    )
    text, cid = "", None
    async for chunk in stream:
        cid = chunk.id
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    return Answer("long", cid, text)


async def tool_call(client: openai.AsyncOpenAI, n: int) -> Answer:
    completion = await client.chat.completions.create(
        model="offline", messages=[{"role": "user", "content": f'[[tool:lookup {{"q": "n{n}"}}]]'}],
    )
    return Answer("tool", completion.id, completion.choices[0].message.content or "")


async def steady_load(client: openai.AsyncOpenAI, stop: asyncio.Event, caller: int) -> list[Answer]:
    """One caller's requests, streamed and tool calls in turn, until `stop`."""
    answers = []
    n = 0
    while not stop.is_set():
        n += 1
        kind = streamed if (n + caller) % 2 else tool_call
        try:
            answers.append(await kind(client, caller * 1000 + n))
        except openai.OpenAIError as exc:
            answers.append(Answer(kind.__name__, None, "", f"{type(exc).__name__}: {exc}"))
    return answers


async def holding_a_hop(redis, stream: str) -> str:  # type: ignore[no-untyped-def]
    """A replica holding an entry of `stream` (pending for 60 ms: longer than a replied
    entry waits for its ack, shorter than the tagger holds a long stream's chunk)."""

    async def holder() -> str | None:
        held = await redis.xpending_range(stream, GROUP, min="-", max="+", count=1, idle=60)
        return held[0]["consumer"].decode() if held else None

    found = await wait_for(holder, timeout=10, every=0.01)
    assert found, "no v1 replica held a hop"
    return str(found)


async def watch_status(redis, keys, seen: dict[str, float], stop: asyncio.Event) -> None:  # type: ignore[no-untyped-def]
    """When `hookbus status` last listed each replica of the group (polled every 0.2 s)."""
    while not stop.is_set():
        status = await read_status(redis, keys)
        now = time.time()
        for group in status.groups:
            if group.name == GROUP:
                for replica in group.replicas:
                    seen[replica] = now
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)


async def test_a_group_replaced_replica_by_replica_under_load_fails_and_mixes_nothing(procs, redis, keys, prefix, tmp_path):
    gateway_port = free_port()
    api_keys = tmp_path / "keys.json"
    api_keys.write_text(json.dumps({KEY: {"peer_user_id": "rollout"}}))
    replicas = {name: procs.worker(GROUP, SKILL, replica=name, version="v1") for name in ("v1-a", "v1-b", "v1-c")}
    orchestrator = procs.orchestrator(AGENT, instance="orch-1", claim_idle=3)
    gateway = procs.gateway(port=gateway_port, api_keys=api_keys)
    await procs.wait_ready(*replicas.values(), orchestrator)
    base = f"http://127.0.0.1:{gateway_port}"
    await procs.wait_http(gateway, f"{base}/healthz")

    stop_load, stop_watch = asyncio.Event(), asyncio.Event()
    seen: dict[str, float] = {}
    told_to_stop: dict[str, float] = {}
    exited_in: dict[str, float] = {}
    watcher = asyncio.create_task(watch_status(redis, keys, seen, stop_watch))
    async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0, timeout=60) as client:
        await redis.set(fault_key("hold", prefix=prefix), 1)  # long streams hold v1 hops until the kill
        load = [asyncio.create_task(steady_load(client, stop_load, caller)) for caller in range(CLIENTS)]
        long_streams = [asyncio.create_task(long_stream(client, n)) for n in range(2)]
        await asyncio.sleep(1.0)

        async def replace(old: str | None, new: str, version: str, *, kill: bool = False) -> str:
            """Start `new`, then stop `old` (None: a v1 replica holding a hop, killed)."""
            replicas[new] = procs.worker(GROUP, SKILL, replica=new, version=version)
            await procs.wait_ready(replicas[new])
            old = old or await holding_a_hop(redis, keys.pinned_hooks_for(GROUP, "v1", ""))
            told_to_stop[old] = time.time()
            if kill:
                replicas[old].kill()
                await redis.delete(fault_key("hold", prefix=prefix))
            else:
                await asyncio.to_thread(replicas[old].terminate, 45)
                assert replicas[old].popen.returncode == 0, replicas[old].log_tail()
                exited_in[old] = time.time() - told_to_stop[old]
            await asyncio.sleep(0.5)
            return old

        victim = await replace(None, "v2-a", "v2", kill=True)  # SIGKILL: its held hops go to a v1 sibling
        await asyncio.sleep(1.5)  # claimed (claim idle 1 s) before the next replica is told to stop
        survivors = sorted({"v1-a", "v1-b", "v1-c"} - {victim})
        await replace(survivors[0], "v2-b", "v2")  # SIGTERM: its v1 sibling serves on
        await replace(survivors[1], "v2-c", "v2")  # SIGTERM: the last of v1 drains
        await asyncio.sleep(1.0)
        stop_load.set()
        answers = [a for batch in await asyncio.gather(*load) for a in batch] + list(await asyncio.gather(*long_streams))

    async def killed_one_gone() -> bool:  # once its heartbeat expired
        return time.time() - seen[victim] > 0.5

    assert await wait_for(killed_one_gone, timeout=REPLICA_TTL + DRAINED_GONE_WITHIN)
    stop_watch.set()
    await watcher

    failed = [a for a in answers if a.error or not a.completion_id]
    assert not failed, (failed[:5], procs.logs())
    assert len(answers) >= 30, len(answers)
    by_version: dict[str, int] = {}
    for answer in answers:
        tags = set(TAG.findall(answer.text))
        ran = {v.decode() for v in await redis.smembers(fault_key("versions", answer.completion_id, prefix=prefix))}
        assert len(tags) == 1 and ran == tags, (answer, ran)  # one version, in the answer and in the hooks
        [version] = ran
        by_version[version] = by_version.get(version, 0) + 1
        pinned = await redis.hget(keys.journal(answer.completion_id), f"pin:{GROUP}")
        assert pinned == version.encode(), (answer, pinned)  # what a recovering orchestrator would keep
    assert set(by_version) == {"v1", "v2"}, by_version
    finalized = {k.decode(): v.decode() for k, v in (await redis.hgetall(fault_key("finalized", prefix=prefix))).items()}
    assert all(finalized.get(a.completion_id or "") in ("v1", "v2") for a in answers)

    last_hop: dict[str, float] = {}
    for record in await recent_events(redis, keys):
        if record.kind == "hop" and record.group == GROUP and record.replica:
            last_hop[record.replica] = max(last_hop.get(record.replica, 0.0), record.ts)
    for name in survivors:
        last = max(last_hop[name], told_to_stop[name])
        assert seen[name] - last < DRAINED_GONE_WITHIN, (name, seen[name] - last_hop[name], seen[name] - told_to_stop[name])
    assert seen[victim] - told_to_stop[victim] < REPLICA_TTL + DRAINED_GONE_WITHIN
    claims = [p.log_tail(2000) for n, p in replicas.items() if n in survivors]
    assert any(f'"previous_owner": "{victim}"' in log for log in claims), "no hop of the killed replica was claimed"

    status = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hookbus.services.cli.main", "status", "--json",
        env=procs.env, cwd=REPO, stdout=asyncio.subprocess.PIPE,
    )
    stdout, _ = await asyncio.wait_for(status.communicate(), 60)
    assert status.returncode == 0
    [tagger] = [g for g in json.loads(stdout)["groups"] if g["name"] == GROUP]
    assert [(v["version"], v["replicas"]) for v in tagger["versions"]] == [("v2", ["v2-a", "v2-b", "v2-c"])]
    gone_after = {n: round(seen[n] - max(last_hop[n], told_to_stop[n]), 2) for n in ("v1-a", "v1-b", "v1-c")}
    print(
        f"rollout: {len(answers)} requests, by version {by_version}, none failed or mixed; SIGTERM to exit (s): "
        f"{ {n: round(t, 2) for n, t in exited_in.items()} }; gone from status after its last hop or signal (s): {gone_after}"
    )
