"""The kit's checks, in the order they run; each raises CheckFailed with the reason.

docs/conformance.md lists them with what each proves. Several checks read the same request
(`_once`): one request in mode "fields" shows the fields, the order, None = unchanged and the
state round trip at every lifecycle point.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from hookbus.bus.connection.values import text
from hookbus.bus.groups.claims import heartbeat_every
from hookbus.bus.groups.registry import (
    REFRESH_EVERY,
    REPLICA_TTL,
    GroupAnnouncement,
    ReplicaHeartbeat,
    leave,
)
from hookbus.bus.groups.versions import ReplicaInfo, check_version, publish
from hookbus.bus.wire.protocol_version import PROTOCOL
from hookbus.services.protocol.conformance.harness import Check, CheckFailed, Harness, Run
from hookbus.services.protocol.conformance.skills import FIELDS, GROUP, HOOK_ERROR, Probe
from hookbus.services.protocol.conformance.worker_process import WorkerProcess
from hookbus.services.protocol.constants import protocol_constants
from hookbus.services.worker.host import GroupHost
from hookbus.skills import HookData

TOOL_TEXT = '[[tool:probe_echo {"text": "hi"}]]'
TOOL_ANSWER = "The tool probe_echo returned: echo: hi"
CHANGED_ANSWER = "The tool probe_echo returned: echo: changed by probe (seen by probe)".upper()
NOT_CHUNKED = [lifecycle for lifecycle in FIELDS if lifecycle != "on_chunk"]


def expect(condition: object, reason: str) -> None:
    if not condition:
        raise CheckFailed(reason)


async def _once(h: Harness, key: str, text: str, mode: str, **options: Any) -> Run:
    """The request `key`, sent once for all the checks that read it."""
    if key not in h.runs:
        h.runs[key] = await h.request(text, mode, **options)
    return h.runs[key]


def normalized(lifecycle: str, copies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies as HookData reads them, so that two languages' JSON of the same data compare equal."""
    fields = set(FIELDS[lifecycle])
    return [
        HookData.model_validate({"lifecycle": lifecycle, **copy}).model_dump(mode="json", include=fields, exclude_none=True)
        for copy in copies
    ]


def _first_difference(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> str:
    if len(a) != len(b):
        return f"{len(a)} calls against {len(b)}"
    for index, (x, y) in enumerate(zip(a, b, strict=True)):
        for name in sorted(set(x) | set(y)):
            if x.get(name) != y.get(name):
                return f"call {index}, field {name}: {json.dumps(x.get(name))[:200]} != {json.dumps(y.get(name))[:200]}"
    return "equal"


# ------------------------------------------------------------------ registry


async def check_announcement(h: Harness) -> None:
    body = await h.client.redis.hget(h.keys.registry, GROUP)
    expect(body, f"no announcement in {h.keys.registry}")
    announcement = GroupAnnouncement.model_validate_json(body or b"")
    expect(announcement.protocol == PROTOCOL, f"protocol is {announcement.protocol!r}, not {PROTOCOL!r}")
    expected = GroupHost(GROUP, [Probe()]).announcement()
    shape = {"skill", "method", "lifecycle", "priority", "scope", "timeout", "critical"}
    got = sorted(json.dumps(h.model_dump(include=shape), sort_keys=True) for h in announcement.hooks)
    want = sorted(json.dumps(h.model_dump(include=shape), sort_keys=True) for h in expected.hooks)
    expect(got == want, f"hooks {got} != the spec's {want}")
    tools = {t.name: t for t in announcement.tools}
    expect(set(tools) == {"probe_echo"}, f"tools {sorted(tools)} != ['probe_echo']")
    parameters = tools["probe_echo"].parameters_schema.get("function", {}).get("parameters", {})
    expect("text" in parameters.get("properties", {}), f"probe_echo's schema has no `text`: {tools['probe_echo'].parameters_schema}")


async def check_heartbeat(h: Harness) -> None:
    [replica, *_] = await h.live_replicas() or [""]
    expect(replica, "no replica with a fresh heartbeat")
    first = await h.client.redis.zscore(h.keys.replicas(GROUP), replica)
    body = await h.client.redis.get(h.keys.replica_heartbeat(GROUP, replica))
    expect(body, f"no heartbeat record at {h.keys.replica_heartbeat(GROUP, replica)}")
    beat = ReplicaHeartbeat.model_validate_json(body or b"")
    expect(beat.protocol == PROTOCOL, f"the heartbeat record says protocol {beat.protocol!r}, not {PROTOCOL!r}")
    expect((beat.group, beat.replica) == (GROUP, replica), f"the record names {beat.group}/{beat.replica}")
    ttl = await h.client.redis.ttl(h.keys.replica_heartbeat(GROUP, replica))
    expect(0 < ttl <= REPLICA_TTL, f"the record's TTL is {ttl}, not 1..{REPLICA_TTL:g} s")
    deadline = time.monotonic() + REPLICA_TTL
    while time.monotonic() < deadline:  # a heartbeat is a beat: the score moves on
        await asyncio.sleep(heartbeat_every(5.0) / 4)
        if (await h.client.redis.zscore(h.keys.replicas(GROUP), replica) or 0) > (first or 0):
            return
    raise CheckFailed(f"the heartbeat did not move in {REPLICA_TTL:g} s")


# ------------------------------------------------------------------ one request through every lifecycle


async def _fields_run(h: Harness) -> Run:
    run = await _once(h, "fields", TOOL_TEXT, "fields")
    expect(run.error is None, f"the request failed: {run.error!r}")
    return run


async def check_lifecycle_fields(h: Harness) -> None:
    run = await _fields_run(h)
    for lifecycle in NOT_CHUNKED:
        probe, reference = run.seen("probe", lifecycle), run.seen("ref10", lifecycle)
        expect(probe, f"the probe did not record {lifecycle}")
        a, b = normalized(lifecycle, probe), normalized(lifecycle, reference)
        expect(a == b, f"{lifecycle}: the probe saw other data than the reference: {_first_difference(a, b)}")
    chunks = run.seen("probe", "on_chunk")
    indexes = [c.get("chunk_index") for c in chunks]
    expect(chunks and indexes == list(range(len(chunks))), f"on_chunk: chunk_index ran {indexes}, not 0, 1, 2, ...")
    expect(all(c.get("chunk", {}).get("id") == run.completion_id for c in chunks), "on_chunk: a chunk's id is not the completion id")
    expect(run.state.get("tool_ran") is True and run.text == TOOL_ANSWER, f"the tool hop: answer {run.text!r}")


async def check_none_is_unchanged(h: Harness) -> None:
    run = await _fields_run(h)
    for lifecycle in NOT_CHUNKED:
        before, after = normalized(lifecycle, run.seen("ref10", lifecycle)), normalized(lifecycle, run.seen("ref30", lifecycle))
        expect(before == after, f"{lifecycle}: returning None changed the data: {_first_difference(after, before)}")


async def check_priority_order(h: Harness) -> None:
    run = await _fields_run(h)
    order = run.state.get("order", [])
    for lifecycle in NOT_CHUNKED:
        names = [entry.split(":")[0] for entry in order if entry.endswith(f":{lifecycle}")]
        calls = len(names) // 3
        expect(calls and names == ["ref10", "probe", "ref30"] * calls, f"{lifecycle}: hooks ran in the order {names}")


async def check_state_round_trip(h: Harness) -> None:
    run = await _fields_run(h)
    token = run.ended["metadata"]["conformance_token"]
    expect(run.state.get("token") == token, "the reference's token did not come back")
    expect(run.state.get("probe_token") == token, f"the probe read ctx.state.token as {run.state.get('probe_token')!r}")
    expect(run.seen("probe", "finalize_connection"), "the probe's finalize_connection state did not come back")


async def check_session_round_trip(h: Harness) -> None:
    session = f"conformance-{uuid.uuid4().hex}"
    visits = []
    for _ in range(2):
        run = await h.request("[[echo]] session", "session", stream=False, session_id=session)
        expect(run.error is None, f"the request failed: {run.error!r}")
        visits.append(run.ended.get("session", {}).get("probe_visits"))
    expect(visits == [1, 2], f"ctx.session.data.probe_visits over two requests: {visits}, not [1, 2]")


async def check_changes_seen_by_next_hook(h: Harness) -> None:
    run = await h.request('[[tool:probe_echo {"text": "change me"}]]', "change")
    expect(run.error is None, f"the request failed: {run.error!r}")
    [connection, *_] = run.seen("ref30", "on_connection") or [{}]
    last = (connection.get("messages") or [{}])[-1].get("content", "")
    expect("changed by probe" in last, f"on_connection: the next hook saw {last!r}")
    results = [c.get("tool_result") for c in run.seen("ref30", "after_toolcall")]
    expect(results == ["echo: changed by probe (seen by probe)"], f"after_toolcall: the next hook saw {results}")
    expect(run.text == CHANGED_ANSWER, f"on_chunk: the client got {run.text!r}, not {CHANGED_ANSWER!r}")


async def hop_streams(h: Harness) -> list[str]:
    """Where the group's hops go: its shared stream, and the stream of each version its
    replicas announced (requests are pinned to a version: hookbus.bus.groups.versions)."""
    announced = await h.client.redis.hgetall(h.keys.replica_versions(GROUP))
    versions = sorted({ReplicaInfo.model_validate_json(body).version for body in announced.values()})
    return h.keys.hook_streams(GROUP) + [s for v in versions for s in h.keys.pinned_hook_streams(GROUP, v)]


async def check_batched_on_chunk(h: Harness) -> None:
    mark = f"{int(time.time() * 1000) - 1}-0"
    run = await h.request("[[words:120]]", "chunks")
    expect(run.error is None, f"the request failed: {run.error!r}")
    expected = " ".join(f"w{i}" for i in range(120))
    expect(run.text == expected, f"the client got {run.text[:80]!r}..., not the 120 words")
    batches = []
    carried = 0
    for stream in await hop_streams(h):
        entries: Any = await h.client.redis.xrange(stream, min=mark, max="+")
        for _, fields in entries:
            envelope = json.loads(fields.get(b"e", b"{}"))
            batches.append(envelope.get("chunks", 0))
            if envelope.get("chunks") and (envelope.get("text") is None or b"full_content" in fields.get(b"d", b"")):
                carried += 1
    expect(any(n > 1 for n in batches), f"no batched on_chunk hop was sent (chunks per hop: {batches})")
    # a 1.1 worker keeps each stream's text: no hop carries the text so far (stream_text)
    expect(carried == 0, f"{carried} batched hops carried the text so far: does the group announce {PROTOCOL}?")
    seen = run.seen("probe", "on_chunk")
    indexes = [c.get("chunk_index") for c in seen]
    expect(indexes == list(range(len(run.chunks))), f"the probe saw chunks {indexes[:10]}... of {len(run.chunks)}")
    full = ""
    for copy, sent in zip(seen, run.chunks, strict=True):  # one LLM call: the client saw every chunk
        full += copy.get("content") or ""
        where = f"on_chunk {copy.get('chunk_index')}"
        expect((copy.get("content") or "") == sent, f"{where}: content {copy.get('content')!r}, the client got {sent!r}")
        expect(copy.get("full_content", "") == full, f"{where}: full_content {copy.get('full_content')!r} != {full!r}")


# ------------------------------------------------------------------ failures


async def check_hook_error(h: Harness) -> None:
    run = await h.request("[[echo]] refused", "hook_error", stream=False)
    error = run.error
    expect(error is not None, f"the request succeeded: {run.text!r}")
    assert error is not None
    got = {"status_code": error.status_code, "code": error.code, "message": error.message, "details": error.details}
    expect(got == HOOK_ERROR, f"the client got {got}, not {HOOK_ERROR}")
    expect((run.ended.get("error") or {}).get("code") == "probe_limit", f"finalize_connection saw {run.ended.get('error')}")
    [final, *_] = run.seen("probe", "finalize_connection") or [{}]
    expect((final.get("error") or {}).get("code") == "probe_limit", f"the probe's finalize_connection saw error {final.get('error')}")


async def check_plain_exception_discarded(h: Harness) -> None:
    run = await _once(h, "raise", TOOL_TEXT, "raise", stream=False)
    expect(run.error is None, f"the request failed: {run.error!r}")
    [connection, *_] = run.seen("ref30", "on_connection") or [{}]
    last = (connection.get("messages") or [{}])[-1].get("content", "")
    expect(last == TOOL_TEXT, f"the raising hook's change was kept: the next hook saw {last!r}")


async def check_plain_exception_blocks_tool(h: Harness) -> None:
    run = await _once(h, "raise", TOOL_TEXT, "raise", stream=False)
    expect(run.error is None, f"the request failed: {run.error!r}")
    expect("tool_ran" not in run.state, "the tool ran although before_toolcall raised")
    expect("blocked" in run.text and "probe blocks the tool" in run.text, f"the model saw {run.text!r}")
    expect(len(run.seen("probe", "after_toolcall")) == 1, "after_toolcall did not run once for the blocked call")


async def check_critical_exception(h: Harness) -> None:
    run = await h.request("[[echo]] guarded", "critical", stream=False)
    expect(run.error is not None and (run.error.status_code, run.error.code) == (500, "hook_failed"), f"got {run.error!r}")
    expect((run.ended.get("error") or {}).get("code") == "hook_failed", f"finalize_connection saw {run.ended.get('error')}")


async def check_timeout(h: Harness) -> None:
    run = await h.request("[[echo]] in time", "timeout", stream=False)
    expect(run.error is None and run.text == "in time", f"the request: {run.error!r} {run.text!r}")
    expect(run.seconds < 4.0, f"a 0.5 s timeout on a 5 s hook took {run.seconds:.1f} s")
    expect(run.seen("ref30", "on_connection"), "the chain did not go on after the timeout")


async def check_dead_letters(h: Harness) -> None:
    stream = h.keys.hooks(GROUP)
    await h.client.redis.xadd(stream, {"junk": "no envelope"})
    await h.client.redis.xadd(stream, {"e": json.dumps({"v": 99, "kind": "hop"})})
    deadline = time.monotonic() + 10
    letters: list[dict[bytes, bytes]] = []
    while time.monotonic() < deadline:
        found: Any = await h.client.redis.xrange(h.keys.dead_letter)
        letters = [f for _, f in found if text(f.get(b"source")) == stream]
        if len(letters) >= 2:
            break
        await asyncio.sleep(0.1)
    expect(len(letters) >= 2, f"{len(letters)} of 2 bad entries reached the dead-letter stream")
    expect(all(text(f.get(b"reason")) for f in letters), "a dead letter without a reason")
    run = await h.request("[[echo]] still here", "fields", stream=False)
    expect(run.error is None and run.text == "still here", f"the worker stopped answering: {run.error!r}")


async def check_claim_after_kill(h: Harness) -> None:
    [killed] = await h.live_replicas() or [""]
    request = asyncio.ensure_future(h.request("[[echo]] survived", "kill", stream=False))
    deadline = time.monotonic() + 10
    held = False
    while time.monotonic() < deadline and not request.done() and not held:
        for stream in await hop_streams(h):
            held = held or bool((await h.client.redis.xpending(stream, GROUP))["pending"])
        await asyncio.sleep(0.05)
    if not held:
        request.cancel()
        raise CheckFailed("the hop of mode `kill` never became pending at the worker")
    await asyncio.sleep(0.5)  # the hop is in the worker's hands, its hook asleep
    await asyncio.to_thread(h.worker.kill)
    h.worker.start()
    await h.wait_for_worker(other_than=[killed])
    run = await request
    expect(run.error is None and run.text == "survived", f"after the kill: {run.error!r} {run.text!r}")
    expect((run.state.get("hold_attempt") or 0) >= 2, f"the hop was answered on attempt {run.state.get('hold_attempt')}")


# ------------------------------------------------------------------ what the spec's constants say


async def check_reply_size_limits(h: Harness) -> None:
    """The kit gives the worker HOOKBUS_MAX_STATE_BYTES and HOOKBUS_MAX_HOP_BYTES
    (skills.KIT_MAX_*): a reply over either is a failure reply naming the variable."""
    limits = protocol_constants().limits
    for mode, env in (("big_state", limits.max_state_bytes.env), ("big_data", limits.max_hop_bytes.env)):
        run = await h.request("[[echo]] small", mode, stream=False)
        expect(run.error is None, f"{mode}: the request failed: {run.error!r}")
        expect(run.text == "small", f"{mode}: the over-limit change reached the model: it answered {run.text[:80]!r}...")
        expect("blob" not in run.state, f"{mode}: the over-limit ctx.state came back")
        errors = [r.error or "" for r in await h.worker_records(run.completion_id, "before_llm_call")]
        expect(any(env in e for e in errors), f"{mode}: the worker's before_llm_call hop records say {errors}, none names {env}")


async def check_version_strings(h: Harness) -> None:
    """A version the spec's rule refuses (here with a trailing newline, or starting with a
    dash) stops the worker before it announces anything."""
    for bad in ("v2\n", "-v2"):
        try:
            check_version(bad)
        except ValueError:
            pass
        else:  # pragma: no cover - the kit's own rule
            raise CheckFailed(f"the kit's rule takes {bad!r}")
        before = set(await h.live_replicas())
        worker = WorkerProcess(h.worker.command, {**h.worker.env, "HOOKBUS_WORKER_VERSION": bad})
        worker.start()
        try:
            deadline = time.monotonic() + 60
            while worker.exited is None and time.monotonic() < deadline:
                started = set(await h.live_replicas()) - before
                expect(not started, f"HOOKBUS_WORKER_VERSION={bad!r}: the worker started (replica {', '.join(started)})")
                await asyncio.sleep(0.1)
            expect(worker.exited not in (None, 0), f"HOOKBUS_WORKER_VERSION={bad!r}: the worker did not exit with an error in 60 s")
        finally:
            await asyncio.to_thread(worker.kill)
            worker.log_path.unlink(missing_ok=True)
            for wrongly in set(await h.live_replicas()) - before:  # a worker that wrongly started: gone for the next checks
                await leave(h.client.redis, h.keys, GROUP, wrongly)


async def check_drain_timing(h: Harness) -> None:
    """SIGTERM to the last replica of its version while another version takes new requests:
    it is marked draining at once and serves on for the spec's drain_pin_settle (no request
    is pinned to it), then leaves the group. The other version is the kit's stand-in (a
    version record and heartbeats, no process); the worker is started again afterwards."""
    settle = protocol_constants().timings.drain_pin_settle
    [replica, *_] = await h.live_replicas() or [""]
    expect(replica, "no live replica")
    other = "conformance-other-version"
    await publish(h.client.redis, h.keys, GROUP, other, ReplicaInfo(version="conformance-other", hooks="00000000"))

    async def beat() -> None:
        while True:
            await h.client.redis.zadd(h.keys.replicas(GROUP), {other: time.time()})
            await asyncio.sleep(0.2)

    beating = asyncio.ensure_future(beat())
    try:
        await asyncio.sleep(0.3)  # the stand-in's first beats
        h.worker.terminate()
        marked = left = None
        deadline = time.monotonic() + settle + 30
        while left is None and time.monotonic() < deadline:
            body = await h.client.redis.hget(h.keys.replica_versions(GROUP), replica)
            if marked is None and body and ReplicaInfo.model_validate_json(body).draining:
                marked = time.monotonic()
            if await h.client.redis.zscore(h.keys.replicas(GROUP), replica) is None:
                left = time.monotonic()
            await asyncio.sleep(0.02)
        expect(marked is not None, "the replica was never marked draining")
        expect(left is not None, "the replica did not leave the group")
        assert marked is not None and left is not None
        served = left - marked
        expect(served >= settle - 0.1, f"it left {served:.2f} s after it was marked draining, not after the spec's {settle} s")
        expect(served <= settle + 5, f"it left {served:.2f} s after it was marked draining: no request held it past {settle} s")
    finally:
        beating.cancel()
        await h.client.redis.zrem(h.keys.replicas(GROUP), other)
        await h.client.redis.hdel(h.keys.replica_versions(GROUP), other)
        await asyncio.to_thread(h.worker.stop)
        h.worker.start()
        await h.wait_for_worker(other_than=[replica])
        await asyncio.sleep(2 * REFRESH_EVERY + 0.25)  # every orchestrator's view lost the stand-in


CHECKS: list[tuple[str, Check]] = [
    ("announcement", check_announcement),
    ("heartbeat", check_heartbeat),
    ("lifecycle_fields", check_lifecycle_fields),
    ("none_is_unchanged", check_none_is_unchanged),
    ("priority_order", check_priority_order),
    ("state_round_trip", check_state_round_trip),
    ("session_round_trip", check_session_round_trip),
    ("changes_seen_by_next_hook", check_changes_seen_by_next_hook),
    ("batched_on_chunk", check_batched_on_chunk),
    ("hook_error", check_hook_error),
    ("plain_exception_discarded", check_plain_exception_discarded),
    ("plain_exception_blocks_tool", check_plain_exception_blocks_tool),
    ("critical_exception", check_critical_exception),
    ("timeout", check_timeout),
    ("dead_letters", check_dead_letters),
    ("reply_size_limits", check_reply_size_limits),
    ("version_strings", check_version_strings),
    ("drain_timing", check_drain_timing),
]
KILL_CHECK: tuple[str, Check] = ("claim_after_kill", check_claim_after_kill)
