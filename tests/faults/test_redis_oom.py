"""Redis at `maxmemory` (policy noeviction): a new request gets a clear 503, from the
gateway and from `hookbus send` (no traceback), the services log the trouble once when
it starts, not a traceback every second or two, and an orchestrator started meanwhile
waits for memory instead of exiting. A request already in flight ends within seconds
with the same 503, whichever client waits for it; finalize_connection runs once for it,
and its terminal item and ack are stored when memory returns."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from hookbus.bus.client import HookbusClient
from hookbus.bus.connection.embedded import EmbeddedRedis
from hookbus.bus.keys import ORCHESTRATOR_GROUP, Keys
from hookbus.bus.wire.envelopes import response_items
from hookbus.skills import HookbusError, RedisOutOfMemory
from tests.gateway.server import running_gateway
from tests.integration.processes import REPO, Processes
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

PREFIX = "oom:"


def fill(url: str) -> None:
    """Put Redis over its maxmemory for good: fill it, then lower maxmemory below its use."""
    with redis.Redis.from_url(url) as client:
        for n in range(40):
            client.set(f"filler:{n}", b"x" * 100_000)
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", str(used // 2))
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("one-more", "x")


def free(url: str) -> None:
    with redis.Redis.from_url(url) as admin:
        admin.config_set("maxmemory", "0")


@dataclass
class Stack:
    server: EmbeddedRedis
    procs: Processes


@contextlib.asynccontextmanager
async def redis_of_its_own(tmp_path: Path, service_env: dict[str, str], **env: str) -> AsyncIterator[Stack]:
    """A Redis server for this test alone (it is filled up), and processes on it."""
    server = EmbeddedRedis(directory=tmp_path / "redis", appendonly=False)
    server.start()
    procs = Processes(dict(service_env, REDIS_URL=server.url, HOOKBUS_PREFIX=PREFIX, **env), tmp_path / "logs")
    try:
        yield Stack(server, procs)
    finally:
        procs.close()
        server.cleanup()


def send(url: str, text: str) -> Awaitable[subprocess.CompletedProcess[str]]:
    """`hookbus send TEXT` in a process of its own."""
    return asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "hookbus.services.cli.main", "send", text],
        env={**os.environ, "REDIS_URL": url, "HOOKBUS_PREFIX": PREFIX},
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )


async def test_a_full_redis_answers_503_and_the_services_log_it_once(tmp_path, service_env) -> None:
    async with redis_of_its_own(tmp_path, service_env) as stack:
        server, procs = stack.server, stack.procs
        orchestrator = procs.orchestrator("tests.faults.fault_skills:agent", instance="orch-oom", claim_idle=1)
        await procs.wait_ready(orchestrator)
        fill(server.url)
        await asyncio.sleep(4)  # heartbeats, leases, events: every loop meets the OOM

        async with HookbusClient(server.url, prefix=PREFIX) as client:
            with pytest.raises(RedisOutOfMemory) as refused:
                await client.complete("hi")
        assert refused.value.status_code == 503 and refused.value.code == "redis_out_of_memory"

        async with (
            running_gateway(server.url, PREFIX, models=["offline"]) as gateway,
            httpx.AsyncClient(base_url=gateway.url, timeout=30) as http,
        ):
            response = await http.post(
                "/v1/chat/completions",
                json={"model": "offline", "messages": [{"role": "user", "content": "hi"}]},
            )
        assert response.status_code == 503
        assert "out of memory" in response.json()["error"]["message"]

        sent = await send(server.url, "hi")
        assert sent.returncode == 1
        assert "error 503 redis_out_of_memory" in sent.stderr and "Traceback" not in sent.stderr

        late = procs.orchestrator("tests.faults.fault_skills:agent", instance="orch-late", claim_idle=1)
        async def waiting_for_memory() -> bool:  # started during the OOM: it waits, it does not exit
            return "waiting_for_redis_memory" in late.log_tail(200)

        assert await wait_for(waiting_for_memory, timeout=30), late.log_tail(50)
        assert late.alive

        log = orchestrator.log_tail(10_000)
        assert "Traceback" not in log, log[-3000:]
        assert log.count("heartbeat_failing") == 1, log[-3000:]
        assert orchestrator.alive

        free(server.url)
        await procs.wait_ready(late)
        async with HookbusClient(server.url, prefix=PREFIX) as client:
            assert (await client.complete("[[echo]] back")).choices[0].message.content == "back"
        assert "heartbeat_recovered" in orchestrator.log_tail(10_000)


LONG_ANSWER = "[[delay:60000]] "
"""The offline model answers after 60 s: without this fix, each client below would wait
for its deadline (30 s) and get a 504."""
LONG_STREAM = "[[words:200]] [[delay:250]] "
"""200 words, one every 250 ms: the stream is well under way when Redis fills up."""


@dataclass
class Ended:
    """How one in-flight request ended for its client: the status (None for an SSE error
    event, which comes after a 200), the error code, the chunks it had got, and when
    (seconds after Redis filled up)."""

    client: str
    status: int | None
    code: str
    chunks: int = 0
    after: float = 0.0


async def through_the_client(url: str, started: asyncio.Event) -> Ended:
    async with HookbusClient(url, prefix=PREFIX, timeout=30) as client:
        started.set()
        try:
            await client.complete(LONG_ANSWER + "one", completion_id="chatcmpl-oom-client")
        except HookbusError as exc:
            return Ended("HookbusClient", exc.status_code, exc.code)
    return Ended("HookbusClient", 200, "answered")


async def through_the_gateway(http: httpx.AsyncClient, started: asyncio.Event) -> Ended:
    started.set()
    response = await http.post(
        "/v1/chat/completions",
        json={"model": "offline", "messages": [{"role": "user", "content": LONG_ANSWER + "two"}]},
    )
    return Ended("gateway", response.status_code, response.json()["error"]["code"] if response.status_code != 200 else "")


async def streamed_by_the_gateway(http: httpx.AsyncClient, started: asyncio.Event) -> Ended:
    """The SSE stream's chunks, then its error event (status 200: headers went out first)."""
    body = {"model": "offline", "stream": True, "messages": [{"role": "user", "content": LONG_STREAM + "three"}]}
    chunks = 0
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event: dict[str, Any] = json.loads(line[len("data: "):])
            if "error" in event:
                return Ended("gateway stream", None, event["error"]["code"], chunks)
            chunks += 1
            if chunks == 3:
                started.set()
    return Ended("gateway stream", response.status_code, "no error event", chunks)


async def streamed_by_send(url: str, started: asyncio.Event) -> Ended:
    started.set()
    sent = await send(url, LONG_STREAM + "four")
    assert "Traceback" not in sent.stderr, sent.stderr
    error = re.search(r"error (\d+) (\w+):", sent.stderr)
    assert sent.returncode == 1 and error, (sent.returncode, sent.stderr)
    return Ended("hookbus send", int(error[1]), error[2], len(sent.stdout.split()))


async def test_requests_in_flight_when_redis_fills_up_end_with_a_503_within_seconds(tmp_path, service_env) -> None:
    ledger = tmp_path / "finalized.jsonl"
    async with redis_of_its_own(tmp_path, service_env, HOOKBUS_TEST_LEDGER=str(ledger)) as stack:
        server, procs = stack.server, stack.procs
        keys = Keys(PREFIX)
        orchestrators = [
            # 3 s: above a heartbeat thread's scheduling gaps on two busy cores (1 s let b
            # take a running request of a's before Redis even filled), below the OOM phase
            procs.orchestrator("tests.faults.oom_skills:agent", instance=name, claim_idle=3)
            for name in ("orch-a", "orch-b")  # b would take a's requests over, were a's leases to lapse
        ]
        await procs.wait_ready(*orchestrators)
        admin = redis.Redis.from_url(server.url)

        def pending() -> int:
            return sum(int(admin.xpending(s, ORCHESTRATOR_GROUP)["pending"]) for s in keys.request_streams)

        async with (
            running_gateway(server.url, PREFIX, models=["offline"], timeout=30) as gateway,
            httpx.AsyncClient(base_url=gateway.url, timeout=60) as http,
        ):
            starts = [asyncio.Event() for _ in range(4)]
            clients = [
                asyncio.create_task(through_the_client(server.url, starts[0])),
                asyncio.create_task(through_the_gateway(http, starts[1])),
                asyncio.create_task(streamed_by_the_gateway(http, starts[2])),
                asyncio.create_task(streamed_by_send(server.url, starts[3])),
            ]
            for started in starts:
                await asyncio.wait_for(started.wait(), 30)
            assert await wait_for(lambda: asyncio.to_thread(lambda: pending() == 4), timeout=30), pending()

            fill(server.url)
            full_at = time.monotonic()
            ended_at: dict[asyncio.Task[Ended], float] = {}
            for task in clients:
                task.add_done_callback(lambda task: ended_at.setdefault(task, time.monotonic() - full_at))
            _done, waiting = await asyncio.wait(clients, timeout=30)
            assert not waiting, "a client still waits 30 s after Redis filled up"
        ended = [task.result() for task in clients]
        for end, task in zip(ended, clients, strict=True):
            end.after = round(ended_at[task], 2)
        print("in-flight requests ended:", ended)
        assert [(e.status, e.code) for e in ended] == [(503, "redis_out_of_memory")] * 2 + [
            (None, "redis_out_of_memory"), (503, "redis_out_of_memory"),
        ], ended
        assert max(e.after for e in ended) < 10, ended
        assert ended[2].chunks >= 3 and ended[3].chunks >= 1, ended  # both streams were under way

        def finalized() -> list[dict[str, Any]]:
            return [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []

        # finalize_connection runs at once, during the OOM: each client's cancel is a
        # PUBLISH, which Redis still takes; the run ends as on a disconnect (499)
        assert await wait_for(lambda: asyncio.to_thread(lambda: len(finalized()) == 4), timeout=10), finalized()
        assert {(f["error"], f["recovery"]) for f in finalized()} == {(499, False)}, finalized()
        assert pending() == 4  # their terminal items and acks wait for memory

        free(server.url)
        freed_at = time.monotonic()
        assert await wait_for(lambda: asyncio.to_thread(lambda: pending() == 0), timeout=15), pending()
        print(f"terminal items stored and acked {time.monotonic() - freed_at:.2f} s after memory returned")
        cids = [f["completion_id"] for f in finalized()]
        assert len(set(cids)) == 4 and "chatcmpl-oom-client" in cids, cids
        for cid in cids:
            journal = {k.decode(): v.decode() for k, v in admin.hgetall(keys.journal(cid)).items()}
            assert (journal.get("finalized"), journal.get("done")) == ("1", "1"), (cid, journal)
            [(_id, fields)] = admin.xrevrange(keys.responses(cid), count=1)
            terminal = response_items(fields)[-1]
            assert terminal.kind == "error" and (terminal.error or {}).get("status_code") == 499, terminal
        assert len(finalized()) == 4  # nobody finalized them again

        logs = "\n".join(o.log_tail(10_000) for o in orchestrators)
        assert "Traceback" not in logs, logs[-3000:]
        assert logs.count("response_write_waiting_for_memory") == 4, logs[-3000:]
        assert logs.count("response_write_resumed") == 4, logs[-3000:]
        async with HookbusClient(server.url, prefix=PREFIX) as client:
            assert (await client.complete("[[echo]] back")).choices[0].message.content == "back"
        admin.close()


async def test_a_request_read_while_redis_is_full_runs_when_memory_returns(tmp_path, service_env) -> None:
    ledger = tmp_path / "finalized.jsonl"
    async with redis_of_its_own(tmp_path, service_env, HOOKBUS_TEST_LEDGER=str(ledger)) as stack:
        orchestrator = stack.procs.orchestrator("tests.faults.oom_skills:agent", instance="orch-oom", claim_idle=1)
        await stack.procs.wait_ready(orchestrator)
        async with HookbusClient(stack.server.url, prefix=PREFIX, timeout=60) as client:
            orchestrator.pause()  # it gets the request while stopped, and begins it during the OOM
            request = await client.submit("[[echo]] later", stream=False)
            fill(stack.server.url)
            orchestrator.resume()
            assert await wait_for(
                lambda: asyncio.to_thread(lambda: "request_not_started" in orchestrator.log_tail(10_000)), timeout=10
            ), orchestrator.log_tail(50)
            free(stack.server.url)
            items = [item async for item in client.items(request)]
        assert items[-1].kind == "final" and items[-1].completion is not None, items
        assert items[-1].completion["choices"][0]["message"]["content"] == "later"
        assert [json.loads(line)["completion_id"] for line in ledger.read_text().splitlines()] == [request.completion_id]
        assert "Traceback" not in orchestrator.log_tail(10_000), orchestrator.log_tail(10_000)[-3000:]


async def test_a_client_that_hangs_up_while_redis_is_full_gets_its_request_cancelled(tmp_path, service_env) -> None:
    """The gateway's cancel marker is refused, its PUBLISH is not: finalize runs at once."""
    ledger = tmp_path / "finalized.jsonl"
    async with redis_of_its_own(tmp_path, service_env, HOOKBUS_TEST_LEDGER=str(ledger)) as stack:
        orchestrator = stack.procs.orchestrator("tests.faults.oom_skills:agent", instance="orch-oom", claim_idle=1)
        await stack.procs.wait_ready(orchestrator)
        body = {"model": "offline", "stream": True, "messages": [{"role": "user", "content": LONG_STREAM + "bye"}]}
        async with (
            running_gateway(stack.server.url, PREFIX, models=["offline"]) as gateway,
            httpx.AsyncClient(base_url=gateway.url, timeout=30) as http,
        ):
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                completion_id = response.headers["x-hookbus-completion-id"]
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        break
                fill(stack.server.url)
            hung_up_at = time.monotonic()  # long before the gateway would give up on its own

            def finalized() -> list[dict[str, Any]]:
                return [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []

            assert await wait_for(lambda: asyncio.to_thread(finalized), timeout=10), "finalize did not run"
            took = time.monotonic() - hung_up_at
        assert [(f["completion_id"], f["error"]) for f in finalized()] == [(completion_id, 499)]
        print(f"finalize ran {took:.2f} s after the client hung up")
        assert took < 1.5, took  # the model alone streams for 50 s more; the gateway gives up after 2-4 s
        free(stack.server.url)
