"""What the TypeScript SDK does as the Python one does, through the gateway with the real
`openai` client (tests/typescript/skills/parity.ts in a TypeScript group, the Python
orchestrator and gateway, each a real process):

- an observer (`observe: true`) gets each request's stages after the request, with the
  final state (what its blocking hooks and its earlier observers wrote); one that sleeps
  2 s delays no request;
- a `holdBack` on_chunk hook keeps a phrase split over chunks from the client: raising,
  not one byte of it arrives; rewriting `data.held`, the client reads "[filtered]";
- an on_compaction hook runs for a compaction in a request, in both forms (the
  `onCompaction` method and a decorated hook);
- a TypeScript replica announces its version (`--version`, else a hash of its hooks that
  is the Python worker's for the same hooks) and `hookbus status --json` shows it; the
  requests are pinned to it and its hop records carry it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import openai
import pytest
import redis.asyncio as aredis
from openai.types.chat import ChatCompletionMessageParam

from hookbus.bus.groups.registry import GroupAnnouncement
from hookbus.bus.keys import Keys
from hookbus.bus.wire.envelopes import MonitorRecord
from hookbus.services.cli.monitor import recent_events
from hookbus.services.worker.versioning import hooks_fingerprint
from tests.conversations import conversation
from tests.integration.processes import REPO, Proc, Processes
from tests.typescript.conftest import Stack, ts_stack, ts_worker
from tests.waiting import wait_for

PARITY = REPO / "tests" / "typescript" / "skills" / "parity.ts"
HASHED = REPO / "tests" / "typescript" / "skills" / "extras.ts"
VERSION = "ts-7"
PLAIN, HELD, PLAIN_GUARD, FILTER = "sk-parity-plain-0123", "sk-parity-held-0123", "sk-parity-guard-0123", "sk-parity-filter-0123"
API_KEYS = {
    PLAIN: {"peer_user_id": "plain", "scopes": []},
    HELD: {"peer_user_id": "held", "scopes": ["held"]},
    PLAIN_GUARD: {"peer_user_id": "unheld", "scopes": ["plain"]},
    FILTER: {"peer_user_id": "filter", "scopes": ["filter"]},
}


@pytest.fixture(scope="module")
async def parity(redis_url: str, offline_llm_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    def workers(procs: Processes) -> list[Proc]:
        return [
            ts_worker(procs, "tsp", [PARITY], replica="tsp-1", extra=["--version", VERSION]),
            ts_worker(procs, "tsh", [HASHED], replica="tsh-1"),
        ]

    async with ts_stack(
        redis_url, offline_llm_url, tmp_path_factory.mktemp("ts-parity"), agent="tests.typescript.py_skills:parity_agent",
        api_keys=API_KEYS, workers=workers,
    ) as running:
        yield running


def client(stack: Stack, key: str = PLAIN) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0, timeout=30)


async def stream(stack: Stack, key: str, text: str) -> tuple[str, str | None, BaseException | None]:
    """(the text the client received, the completion id, the error that ended the stream)."""
    received: list[str] = []
    cid = None
    error: BaseException | None = None
    async with client(stack, key) as api:
        try:
            chunks = await api.chat.completions.create(model="offline", stream=True, messages=[{"role": "user", "content": text}])
            async for chunk in chunks:
                cid = chunk.id
                if chunk.choices and chunk.choices[0].delta.content:
                    received.append(chunk.choices[0].delta.content)
        except openai.APIError as exc:
            error = exc
    return "".join(received), cid, error


def observed(stack: Stack, cid: str) -> list[dict]:
    return [e for e in stack.of(cid) if e["hook"] == "ts-audit.finished"]


async def test_a_typescript_observer_sees_each_request_finished_and_delays_none(parity: Stack) -> None:
    answers: list[tuple[str, float, float]] = []  # (completion id, sent, answered)
    for n in range(3):
        sent = time.time()
        text, cid, error = await stream(parity, PLAIN, f"[[echo]] request {n} goes by")
        answered = time.time()
        assert error is None and text == f"request {n} goes by" and cid is not None
        answers.append((cid, sent, answered))
    async with client(parity) as api:
        sent = time.time()
        with pytest.raises(openai.APIStatusError) as failed:
            await api.chat.completions.create(model="offline", messages=[{"role": "user", "content": "[[error:503]] down"}])
        failed_at = time.time()

    # each request's finalize_connection observer, run once, after the request, off its path
    entries = await parity.wait_journal(lambda es: sum(e["hook"] == "ts-audit.finished" for e in es) >= 4, timeout=30)
    for cid, sent, answered in answers:
        [seen] = observed(parity, cid)
        assert seen["began"] >= seen["stage_ended"] >= seen["stage_started"] >= sent
        assert seen["ended"] - seen["began"] >= 1.9  # the 2 s sleep (a timer may fire a millisecond early)
        assert answered < seen["ended"] - 1.0, (answered, seen)  # the client had its answer long before
        # the final state: the blocking hook's mark, the on_connection observer's stamp, every chunk seen in order
        assert seen["ts_marked"] == "2 messages"
        assert sent <= seen["audit_started"] <= seen["stage_ended"]
        assert seen["full"] == seen["last"] == text_of(cid, answers)
        assert seen["chunks"] >= 4 and seen["error"] is None and seen["attempt"] == 1
    [failure] = [e for e in entries if e["hook"] == "ts-audit.finished" and e["error"] is not None]
    assert failed.value.status_code == 503
    assert failure["error"] == 503 and failure["began"] >= sent and failed_at < failure["ended"] - 1.0

    # recorded on the events stream (batched, so a moment later) as the Python observer replica records them
    redis = aredis.Redis.from_url(parity.env["REDIS_URL"])
    keys = Keys(parity.env["HOOKBUS_PREFIX"])

    async def all_recorded() -> dict[tuple[str, str], MonitorRecord] | None:
        records = {(r.completion_id, r.lifecycle): r for r in await recent_events(redis, keys) if r.kind == "observe" and r.group == "tsp"}
        return records if all((cid, "finalize_connection") in records for cid, _, _ in answers) else None

    try:
        mine = await wait_for(all_recorded, timeout=10)

        async def all_acked() -> bool:
            return (await redis.xpending(keys.observe_shard("tsp", 0), "tsp"))["pending"] == 0

        acked = await wait_for(all_acked, timeout=10)
    finally:
        await redis.aclose()
    assert mine is not None
    for cid, _, _ in answers:
        assert mine[(cid, "finalize_connection")].hooks == ["ts-audit.finished"]
        assert mine[(cid, "finalize_connection")].outcome == "ok" and mine[(cid, "finalize_connection")].replica == "tsp-1"
        assert mine[(cid, "on_chunk")].hooks == ["ts-audit.chunk"]
    assert acked  # every observation acked (a moment after its run: acks are batched)


def text_of(cid: str, answers: list[tuple[str, float, float]]) -> str:
    n = [c for c, _, _ in answers].index(cid)
    return f"request {n} goes by"


async def test_no_byte_of_a_phrase_a_typescript_window_rejects_reaches_the_client(parity: Stack) -> None:
    text, _, error = await stream(parity, HELD, "[[echo]] the plan is top secret and more")
    assert error is not None and "blocked phrase" in str(error)
    assert "top" not in text and "secret" not in text
    assert "the plan is".startswith(text.strip()) or text == ""
    # the same TypeScript guard without a window: the phrase's first word was on the client already
    leaked, _, plain_error = await stream(parity, PLAIN_GUARD, "[[echo]] the plan is top secret and more")
    assert plain_error is not None and leaked.endswith(" top")


async def test_a_typescript_hook_rewrites_the_held_text(parity: Stack) -> None:
    text, _, error = await stream(parity, FILTER, "[[echo]] the plan is top secret and more")
    assert error is None
    assert text == "the plan is [filtered] and more"
    clean, _, _ = await stream(parity, FILTER, "[[words:30]]")
    assert clean == " ".join(f"w{n}" for n in range(30))


async def test_a_typescript_window_judges_a_non_streamed_answer_as_a_stream(parity: Stack) -> None:
    """The answer as one chunk through the windowed TypeScript hooks: the stream's refusal,
    the stream's rewrite (docs/observers.md, Answers that are not streamed)."""
    secret = "[[echo]] the plan is top secret and more"
    _, _, streamed = await stream(parity, HELD, secret)
    async with client(parity, HELD) as api:
        with pytest.raises(openai.APIStatusError) as refused:
            await api.chat.completions.create(model="offline", messages=[{"role": "user", "content": secret}])
    assert isinstance(streamed, openai.APIError)
    assert (refused.value.code, refused.value.message) == (streamed.code, streamed.message)
    async with client(parity, FILTER) as api:
        answer = await api.chat.completions.create(model="offline", messages=[{"role": "user", "content": secret}])
    assert answer.choices[0].message.content == "the plan is [filtered] and more"


async def test_typescript_on_compaction_hooks_run_for_a_compaction_in_a_request(parity: Stack) -> None:
    messages = cast(list[ChatCompletionMessageParam], [*conversation(10), {"role": "user", "content": "[[echo]] after a long talk"}])
    async with client(parity) as api:
        answer = await api.chat.completions.create(model="offline", messages=messages)
    assert answer.choices[0].message.content == "after a long talk"
    entries = await parity.wait_journal(
        lambda es: any(e["cid"] == answer.id and e["hook"] == "ts-compaction.noted" for e in es)
    )
    method = [e for e in entries if e["cid"] == answer.id and e["hook"] == "ts-compaction.onCompaction"]
    noted = [e for e in entries if e["cid"] == answer.id and e["hook"] == "ts-compaction.noted"]
    assert len(method) == len(noted) >= 1
    assert [e["id"] for e in method] == [e["id"] for e in noted]
    assert all(e["between_turns"] is False for e in noted)
    assert all(e["stage"] != "none" and e["after"] < e["before"] for e in method)


async def test_the_typescript_replicas_versions_show_in_status_and_pin_the_requests(parity: Stack) -> None:
    text, cid, _ = await stream(parity, PLAIN, "[[echo]] pinned")
    assert text == "pinned" and cid is not None
    status = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("hookbus")), "status", "--json",
        env=parity.env, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(status.communicate(), 60)
    assert status.returncode == 0, err.decode()
    groups = {g["name"]: g for g in json.loads(out)["groups"]}
    assert [(v["version"], v["replicas"]) for v in groups["tsp"]["versions"]] == [(VERSION, ["tsp-1"])]
    assert "ts-audit.finished@finalize_connection:90 (observer)" in groups["tsp"]["hooks"]

    redis = aredis.Redis.from_url(parity.env["REDIS_URL"])
    try:
        keys = Keys(parity.env["HOOKBUS_PREFIX"])
        raw = await redis.hget(keys.registry, "tsh")
        pin = await redis.hget(keys.journal(cid), "pin:tsp")
        records = [r for r in await recent_events(redis, keys) if r.kind == "hop" and r.completion_id == cid]
    finally:
        await redis.aclose()
    assert raw is not None
    # without --version: h- and the fingerprint the Python worker computes for the same hooks
    fingerprint = hooks_fingerprint(GroupAnnouncement.model_validate_json(raw))
    assert [(v["version"], v["replicas"]) for v in groups["tsh"]["versions"]] == [(f"h-{fingerprint}", ["tsh-1"])]
    assert pin == VERSION.encode()  # the request was pinned to the TypeScript replica's version
    assert records and {(r.group, r.version) for r in records if r.group == "tsp"} == {("tsp", VERSION)}
