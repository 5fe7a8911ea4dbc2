"""The console's data over HTTP, without a browser: who may see it, what a request's
waterfall holds, and what inspecting and requeueing a dead letter do."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from typing import Any, Protocol

import httpx
import pytest

from hookbus.bus.connection.embedded import free_port
from hookbus.bus.connection.values import text
from hookbus.bus.groups.dead_letters import ORIGINAL_RETENTION, original_key, send_dead_letter
from hookbus.bus.groups.registry import GroupAnnouncement, announce
from hookbus.bus.groups.versions import parse_infos
from hookbus.services.console.data import BEHIND_LAG, POLL_EVERY
from hookbus.services.console.dead_letters import MAX_DEPTH
from hookbus.services.console.routes import LIVE_STREAM_SECONDS
from tests.console.conftest import (
    ADMIN_KEY,
    BOOM_KEY,
    FAILURE,
    HOLD_KEY,
    SECRET,
    STAGE_ORDER,
    TOOL_PROMPT,
    USER_KEY,
    Hold,
    StandaloneConsole,
    bearer,
    dead_letter_a_request,
    send,
)
from tests.gateway.server import RunningGateway, running_gateway
from tests.waiting import wait_for


class Served(Protocol):
    """A console's server: the gateway, or `hookbus console` on its own."""

    @property
    def url(self) -> str: ...


async def get(gateway: Served, path: str, key: str | None = ADMIN_KEY) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
        return await http.get(path, headers=bearer(key) if key else {})


@pytest.fixture(params=["gateway", "standalone"])
def console(request: pytest.FixtureRequest) -> Served:
    """Each console server in turn: what one answers, the other answers the same."""
    served: RunningGateway | StandaloneConsole = request.getfixturevalue(request.param)
    return served


async def request_view(gateway: RunningGateway, **query: str) -> dict[str, Any] | None:
    """The newest finished request matching `query` in the console's list, once it is there."""

    async def found() -> dict[str, Any] | None:
        listed = (await get(gateway, "/console/api/requests?" + "&".join(f"{k}={v}" for k, v in query.items()))).json()
        done = [r for r in listed if r["outcome"] != "running"]
        return done[0] if done else None

    return await wait_for(found, timeout=15, every=0.3)  # type: ignore[no-any-return]


async def test_the_page_loads_for_anyone_but_its_data_only_for_an_admin_key(console: Served) -> None:
    page = await get(console, "/console/", key=None)
    assert page.status_code == 200 and "hookbus console" in page.text
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]  # no clickjacking of its buttons
    script = await get(console, "/console/static/console.js", key=None)
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    for path in ("/console/api/bus", "/console/api/requests", "/console/api/dead-letters", "/console/api/live",
                 "/console/api/requests/chatcmpl-nobody", "/console/api/dead-letters/1-1"):
        missing = await get(console, path, key=None)
        assert missing.status_code == 401, path
        assert missing.headers["www-authenticate"] == "Bearer" and missing.json()["error"]["code"] == "missing_api_key"
        assert (await get(console, path, key="sk-test-not-a-key-at-all")).status_code == 401, path
        refused = await get(console, path, key=USER_KEY)
        assert refused.status_code == 403, path
        assert refused.json()["error"]["code"] == "console_admin_only"
    assert (await get(console, "/console/static/../app.py", key=None)).status_code == 404


async def test_an_unknown_request_or_dead_letter_is_a_404(console: Served) -> None:
    unknown = await get(console, "/console/api/requests/chatcmpl-nobody")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "request_not_found"
    for letter in ("1-1", "not-an-id"):
        gone = await get(console, f"/console/api/dead-letters/{letter}")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "dead_letter_not_found", gone.text
        async with httpx.AsyncClient(base_url=console.url, timeout=10, headers=bearer(ADMIN_KEY)) as http:
            assert (await http.post(f"/console/api/dead-letters/{letter}/requeue", json={})).status_code == 404
            assert (await http.delete(f"/console/api/dead-letters/{letter}")).status_code == 404


@pytest.mark.parametrize("limit", ["\u00b2", "\u0663", "9" * 5000, "-1", "1e3", " 7"])
async def test_a_limit_that_is_not_a_plain_number_is_a_400_that_says_so(console: Served, limit: str) -> None:
    refused = await get(console, f"/console/api/requests?{httpx.QueryParams({'limit': limit})}")
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_limit", "limit")
    assert "whole number" in error["message"] and len(error["message"]) < 300
    assert (await get(console, "/console/api/requests?limit=999999999")).status_code == 200  # more than kept: all kept


async def test_a_dead_letter_nested_too_deep_to_parse_shows_as_its_raw_text(console: Served, stack: Any) -> None:
    redis, keys = stack[0].redis, stack[0].keys
    source = f"{keys.prefix}hostile-{uuid.uuid4().hex[:8]}"
    too_deep = b"[" * 50_000 + b"]" * 50_000  # beyond what Python's JSON parser recurses into
    deep = b'{"a":' * (MAX_DEPTH + 5) + b"1" + b"}" * (MAX_DEPTH + 5)  # parses; hiding and answering it would recurse
    for n, value in enumerate((too_deep, deep)):
        await send_dead_letter(redis, keys.dead_letter, source=source, entry_id=f"{n}-1", reason="hostile",
                               fields={b"e": value}, consumer="test")
    letters = {text(f[b"entry_id"]): text(i) for i, f in await redis.xrange(keys.dead_letter) if f[b"source"] == source.encode()}
    assert (await get(console, "/console/api/dead-letters")).status_code == 200
    for n, value in enumerate((too_deep, deep)):
        hidden = await get(console, f"/console/api/dead-letters/{letters[f'{n}-1']}")
        assert hidden.status_code == 200, hidden.text
        assert hidden.json()["original"]["e"] == f"[hidden: {len(value)} characters]"
        shown = await get(console, f"/console/api/dead-letters/{letters[f'{n}-1']}?content=1")
        assert shown.status_code == 200 and shown.json()["original"]["e"] == value.decode()


async def test_the_bus_view_shows_each_group_with_its_live_replicas(gateway: RunningGateway, stack: Any) -> None:
    async def audit_bus() -> dict[str, Any] | None:
        bus = (await get(gateway, "/console/api/bus")).json()
        found = any(g["name"] == "audit" and len(g["replicas"]) == 2 for g in bus["groups"])
        return bus if found else None

    seen = await wait_for(audit_bus, timeout=10, every=0.3)
    assert seen is not None
    group = next(g for g in seen["groups"] if g["name"] == "audit")
    assert [r["name"] for r in group["replicas"]] == ["audit-0", "audit-1"]
    assert group["live"] and not group["behind"]
    assert all(r["heartbeat_age"] < 10 and r["in_flight"] >= 0 for r in group["replicas"])
    versions = {r["version"] for r in group["replicas"]}  # the same skills: one derived version
    assert len(versions) == 1 and versions.pop().startswith("h-")
    assert "audit.connected@on_connection:50" in group["hooks"] and group["tools"] == ["remember"]
    redis, keys = stack[0].redis, stack[0].keys
    infos = parse_infos(await redis.hgetall(keys.replica_versions("audit")), ["audit-0", "audit-1"])
    for replica in group["replicas"]:  # up since the replica started, as it says, not since the console saw it
        assert replica["up_for"] == pytest.approx(seen["at"] - infos[replica["name"]].started, abs=0.01)
    bus = (await get(gateway, "/console/api/bus")).json()
    assert [o["name"] for o in bus["orchestrators"]] == ["orch-0"]


async def test_a_request_waterfall_holds_every_stage_in_order_with_its_hops(gateway: RunningGateway) -> None:
    completion_id, status = await send(gateway, USER_KEY, TOOL_PROMPT)
    assert status == 200 and completion_id

    hooked = {stage for stage in STAGE_ORDER if stage not in ("llm_call", "tool_call")}  # audit hooks all others

    async def ended() -> dict[str, Any] | None:
        """The whole waterfall: the orchestrator's records and the replicas' hop records
        arrive on each process's own flush, so the request can end before its hops show."""
        response = await get(gateway, f"/console/api/requests/{completion_id}")
        body = response.json() if response.status_code == 200 else None
        if not body or body["request"]["outcome"] == "running":
            return None
        hopped = {s["lifecycle"] for s in body["steps"] if s["kind"] == "hop"}
        return body if hopped >= hooked else None

    waterfall = await wait_for(ended, timeout=15, every=0.3)
    assert waterfall is not None
    request = waterfall["request"]
    assert (request["status"], request["caller"], request["model"]) == (200, "alice", "offline")
    by_group = (await get(gateway, "/console/api/requests?group=audit&caller=alice")).json()
    assert completion_id in [r["completion_id"] for r in by_group]
    assert (await get(gateway, "/console/api/requests?group=nosuchgroup")).json() == []
    assert len((await get(gateway, "/console/api/requests?limit=1")).json()) == 1
    assert (await get(gateway, "/console/api/requests?limit=many")).status_code == 400
    stages = [s for s in waterfall["steps"] if s["kind"] == "stage"]
    assert [s["lifecycle"] for s in stages] == STAGE_ORDER
    starts = [s["start"] for s in waterfall["steps"]]
    assert starts == sorted(starts)
    hops = [s for s in waterfall["steps"] if s["kind"] == "hop"]
    assert hops and {h["group"] for h in hops} == {"audit"}
    assert {h["replica"] for h in hops} <= {"audit-0", "audit-1"}
    assert any(h["hooks"] == ["audit.connected"] for h in hops)
    tool = next(s for s in stages if s["lifecycle"] == "tool_call")
    assert tool["hooks"] == ["remember"] and tool["outcome"] == "ok"
    assert all(s["outcome"] == "ok" for s in waterfall["steps"])


async def test_a_running_request_shows_its_model_and_caller_before_it_ends(gateway: RunningGateway, hold: Hold) -> None:
    sent = asyncio.create_task(send(gateway, HOLD_KEY, "hello"))  # held in before_llm_call until released

    async def running() -> dict[str, Any] | None:
        listed = (await get(gateway, "/console/api/requests?caller=carol&outcome=running")).json()
        return listed[0] if listed else None

    try:
        view = await wait_for(running, timeout=15, every=0.3)
        assert view is not None and not sent.done()
        assert (view["outcome"], view["status"], view["model"], view["caller"]) == ("running", None, "offline", "carol")
    finally:
        hold.release.set()
    completion_id, status = await sent
    assert status == 200 and view["completion_id"] == completion_id
    ended = await request_view(gateway, caller="carol")
    assert ended is not None and (ended["completion_id"], ended["status"], ended["outcome"]) == (completion_id, 200, "ok")
    waterfall = (await get(gateway, f"/console/api/requests/{completion_id}")).json()
    assert waterfall["request"]["started"] <= min(s["start"] for s in waterfall["steps"])  # from the start record
    assert "request_start" not in {s["lifecycle"] for s in waterfall["steps"]}


async def test_a_hook_that_fails_shows_its_error_and_finalize_still_ran(gateway: RunningGateway) -> None:
    _, status = await send(gateway, BOOM_KEY, "hello")
    assert status == 503
    request = await request_view(gateway, caller="bob", outcome="error")
    assert request is not None and request["status"] == 503 and request["error"] == FAILURE
    also = (await get(gateway, "/console/api/requests?outcome=503")).json()
    assert request["completion_id"] in [r["completion_id"] for r in also]
    waterfall = (await get(gateway, f"/console/api/requests/{request['completion_id']}")).json()
    failed = [s for s in waterfall["steps"] if s["outcome"] != "ok"]
    assert failed and all(s["lifecycle"] == "before_llm_call" and s["error"] == FAILURE for s in failed)
    assert [s["lifecycle"] for s in waterfall["steps"] if s["kind"] == "stage"] == [
        "on_connection", "before_llm_call", "finalize_connection",
    ]
    assert (await get(gateway, "/console/api/requests?caller=nobody")).json() == []


async def test_a_dead_letter_hides_its_content_unless_asked_and_can_be_requeued_and_deleted(
    gateway: RunningGateway, stack: Any
) -> None:
    completion_id = await dead_letter_a_request(stack)

    async def listed() -> dict[str, Any] | None:
        letters = (await get(gateway, "/console/api/dead-letters")).json()
        return next((d for d in letters if d["routing"].get("completion_id") == completion_id), None)

    letter = await wait_for(listed, timeout=10, every=0.3)
    assert letter is not None and letter["reason"].startswith("400 invalid_request")
    hidden = await get(gateway, f"/console/api/dead-letters/{letter['id']}")
    assert hidden.status_code == 200 and SECRET not in hidden.text
    assert hidden.json()["original"]["e"]["completion_id"] == completion_id
    assert hidden.json()["original"]["e"]["messages"][0] == {"role": "user", "content": f"[hidden: {len(SECRET)} characters]"}
    shown = await get(gateway, f"/console/api/dead-letters/{letter['id']}?content=1")
    assert shown.json()["original"]["e"]["messages"][0]["content"] == SECRET
    refused = await get(gateway, f"/console/api/dead-letters/{letter['id']}?content=1", key=USER_KEY)
    assert refused.status_code == 403 and SECRET not in refused.text

    redis, keys = stack[0].redis, stack[0].keys
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10, headers=bearer(ADMIN_KEY)) as http:
        requeued = await http.post(f"/console/api/dead-letters/{letter['id']}/requeue", json={})
        assert requeued.status_code == 200, requeued.text
        moved = requeued.json()
        assert moved["stream"] == keys.requests
        assert (await http.post(f"/console/api/dead-letters/{letter['id']}/requeue", json={})).status_code == 404

        async def set_aside_again() -> list[Any]:
            letters = (await http.get("/console/api/dead-letters")).json()
            return [d for d in letters if d["routing"].get("completion_id") == completion_id]

        again = await wait_for(set_aside_again, timeout=10, every=0.3)
        assert [d["entry_id"] for d in again] == [moved["entry_id"]]  # the requeued entry, read and refused again
        assert (await http.delete(f"/console/api/dead-letters/{again[0]['id']}")).status_code == 204
        assert (await http.get(f"/console/api/dead-letters/{again[0]['id']}")).status_code == 404
    assert await redis.xrange(keys.dead_letter, min=letter["id"], max=letter["id"]) == []
    kept = [k async for k in redis.scan_iter(match=f"{keys.dead_letter}:original:*{moved['entry_id']}")]
    assert kept == []


async def test_the_live_stream_sends_a_snapshot_each_poll_and_ends_in_time(gateway: RunningGateway) -> None:
    started = time.monotonic()
    async with (
        httpx.AsyncClient(base_url=gateway.url, timeout=30) as http,
        http.stream("GET", "/console/api/live", headers=bearer(ADMIN_KEY)) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        frames = [json.loads(line[6:]) async for line in response.aiter_lines() if line.startswith("data: ")]
    took = time.monotonic() - started
    assert LIVE_STREAM_SECONDS <= took <= LIVE_STREAM_SECONDS + 3 * POLL_EVERY  # a stopping gateway never waits long
    assert len(frames) >= LIVE_STREAM_SECONDS / POLL_EVERY - 1
    assert [f["bus"]["at"] for f in frames] == sorted({f["bus"]["at"] for f in frames})  # each poll once, in order
    assert {"bus", "requests", "dead_letters"} <= set(frames[0])


@pytest.fixture(scope="module")
async def open_gateway(stack: Any, redis_url: str, module_prefix: str) -> Any:
    """A gateway without keys, listening on every address (so a client can come from off
    loopback); `*` lets any Host name through, so the console's own rule is what is tested."""
    async with running_gateway(redis_url, module_prefix, host="0.0.0.0", allowed_hosts=["*"]) as gw:
        yield gw


def outside_address() -> str | None:
    """An address of this machine that is not loopback, if it has one."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this picks the outgoing interface
        except OSError:
            return None
        address: str = probe.getsockname()[0]
    return None if address.startswith("127.") else address


async def test_without_keys_the_console_answers_only_loopback_clients(open_gateway: RunningGateway) -> None:
    port = open_gateway.url.rsplit(":", 1)[1]
    async with httpx.AsyncClient(timeout=10) as http:
        local = await http.get(f"http://127.0.0.1:{port}/console/api/bus")
        assert local.status_code == 200 and "groups" in local.json()
        address = outside_address()
        if address is None:
            pytest.skip("this machine has no address but loopback")
        for path in ("/console/", "/console/api/bus", "/console/api/dead-letters"):
            remote = await http.get(f"http://{address}:{port}{path}")
            assert remote.status_code == 403, path
            assert remote.json()["error"]["code"] == "console_loopback_only"


async def test_hookbus_console_serves_the_console_without_a_gateway(
    stack: Any, redis_url: str, module_prefix: str
) -> None:
    port = free_port()
    env = dict(os.environ, REDIS_URL=redis_url, HOOKBUS_PREFIX=module_prefix, HOOKBUS_LOG_FORMAT="json")
    env.pop("HOOKBUS_API_KEYS", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hookbus.services.cli.main", "console", "--port", str(port),
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:

            async def bus() -> dict[str, Any] | None:
                try:
                    response = await http.get("/console/api/bus")
                except httpx.TransportError:
                    return None
                return response.json() if response.status_code == 200 else None

            view = await wait_for(bus, timeout=20, every=0.3)
            assert view is not None and [g["name"] for g in view["groups"]] == ["audit"]
            assert (await http.get("/", follow_redirects=False)).headers["location"] == "/console/"
            assert (await http.get("/console/api/bus", headers={"Host": "evil.example"})).status_code == 403
    finally:
        process.terminate()
        output = (await asyncio.wait_for(process.communicate(), timeout=15))[0].decode()
    assert f"http://127.0.0.1:{port}/console/" in output


async def test_a_dead_letter_whose_original_expired_stays_when_requeue_is_refused(
    gateway: RunningGateway, stack: Any
) -> None:
    completion_id = await dead_letter_a_request(stack)
    redis, keys = stack[0].redis, stack[0].keys
    (letter,) = [
        (entry_id, fields) for entry_id, fields in await redis.xrange(keys.dead_letter)
        if completion_id.encode() in fields[b"original"]
    ]
    letter_id, fields = letter[0].decode(), letter[1]
    kept = original_key(keys.dead_letter, fields[b"source"].decode(), fields[b"entry_id"].decode())
    assert 0 < await redis.ttl(kept) <= ORIGINAL_RETENTION
    await redis.delete(kept)  # what ORIGINAL_RETENTION does to it a day later
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10, headers=bearer(ADMIN_KEY)) as http:
        refused = await http.post(f"/console/api/dead-letters/{letter_id}/requeue", json={})
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "original_gone"
        detail = (await http.get(f"/console/api/dead-letters/{letter_id}")).json()
    assert detail["original"] is None and detail["letter"]["routing"]["completion_id"] == completion_id
    assert len(await redis.xrange(keys.dead_letter, min=letter_id, max=letter_id)) == 1  # nothing lost


async def test_a_group_without_live_replicas_and_far_behind_stands_out(gateway: RunningGateway, stack: Any) -> None:
    redis, keys = stack[0].redis, stack[0].keys
    await announce(redis, keys, GroupAnnouncement(group="ghost"))  # announced once; no replica beats
    (stream,) = keys.hook_streams("ghost")
    await redis.xgroup_create(stream, "ghost", id="0", mkstream=True)
    for n in range(BEHIND_LAG + 20):
        await redis.xadd(stream, {"e": f"hop {n}"})

    async def ghost() -> dict[str, Any] | None:
        """The group once the console's view holds every hop written (a view read while the
        hops were still being written holds fewer: the console polls)."""
        bus = (await get(gateway, "/console/api/bus")).json()
        group = next((g for g in bus["groups"] if g["name"] == "ghost"), None)
        return group if group is not None and group["lag"] >= BEHIND_LAG + 20 else None

    group = await wait_for(ghost, timeout=10, every=0.3)
    assert group is not None
    assert (group["live"], group["behind"], group["lag"], group["replicas"]) == (False, True, BEHIND_LAG + 20, [])
    audit = next(g for g in (await get(gateway, "/console/api/bus")).json()["groups"] if g["name"] == "audit")
    assert audit["live"] and not audit["behind"]
