"""The lifecycle page's TypeScript examples as a hookbus worker group beside a Python group,
through the gateway with the real `openai` client (issue 32):

- one priority order across the two languages, each hook seeing the previous one's
  `ctx.state`, whichever language wrote it; `ctx.session` data written in TypeScript
  persisted for the conversation's next request;
- `[filtered]` from the TypeScript ContentFilter's on_chunk reaches the streaming client;
- the TypeScript SecuritySkill blocks the `rm_rf_root` tool call (the tool never runs, the
  model is told, after_toolcall still runs), while another TypeScript tool runs;
- a TypeScript `PaymentRequired` is a 402 at the client;
- `finalize_connection` runs in TypeScript on every path (success, tool blocked, 402,
  upstream failure), with `data.error` set when the run failed;
- the group's announcement is what the Python model reads, plus `protocol` (this build's), and
  `hookbus status` lists the TypeScript replica like any other.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import openai
import pytest
import redis.asyncio as aredis

from hookbus.bus.groups.registry import GroupAnnouncement
from hookbus.bus.keys import Keys
from hookbus.bus.wire.protocol_version import PROTOCOL
from tests.integration.processes import REPO
from tests.typescript.conftest import KEY, METERED_KEY, Stack


def client(stack: Stack, key: str = KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0, timeout=30)


def hooks(entries: list[dict], *names: str) -> list[str]:
    """The hook names of `entries` in journal order, only those starting with one of `names`."""
    return [e["hook"] for e in entries if not names or e["hook"].startswith(names)]


def finalized(cid: str):  # noqa: ANN201 - a predicate over the journal
    return lambda entries: any(e["cid"] == cid and e["hook"] == "py-probe.finalize" for e in entries) and any(
        e["cid"] == cid and e["hook"] == "request-logger.endLogging" for e in entries
    )


async def test_one_order_across_languages_state_both_ways_and_filtered_chunks(stack: Stack) -> None:
    async with client(stack) as api:
        stream = await api.chat.completions.create(
            model="offline", stream=True, messages=[{"role": "user", "content": "[[echo]] what a darn fine day"}]
        )
        pieces, cid = [], None
        async for chunk in stream:
            cid = chunk.id
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
    text = "".join(pieces)
    assert "[filtered]" in text and "darn" not in text, text
    assert text.startswith("what a") and text.endswith("fine day"), text
    assert cid is not None

    entries = await stack.wait_journal(finalized(cid))
    mine = [e for e in entries if e["cid"] == cid]
    assert hooks(mine, "py-probe.first", "analytics.trackRequest", "py-probe.middle", "state-probe", "request-logger.start", "py-probe.last") == [
        "py-probe.first",  # python, 5
        "analytics.trackRequest",  # typescript, 10
        "py-probe.middle",  # python, 30
        "state-probe.relay",  # typescript, 40
        "request-logger.startLogging",  # typescript, 50 (the default)
        "py-probe.last",  # python, 60
    ]
    relay = next(e for e in mine if e["hook"] == "state-probe.relay")
    last = next(e for e in mine if e["hook"] == "py-probe.last")
    assert relay["py_mark"] == "python was here"  # python's ctx.state reached typescript
    assert last["ts_mark"] == "ts saw python was here"  # and typescript's came back
    assert next(e for e in mine if e["hook"] == "analytics.trackRequest")["stream"] is True
    assert next(e for e in mine if e["hook"] == "analytics.analyzeMessage")["role"] == "assistant"
    end = next(e for e in mine if e["hook"] == "request-logger.endLogging")
    assert end["error"] is None and end["usage"]["total_tokens"] > 0
    assert hooks(mine, "request-logger.endLogging", "py-probe.finalize") == ["request-logger.endLogging", "py-probe.finalize"]


async def test_typescript_session_data_persists_across_a_conversations_requests(stack: Stack) -> None:
    session = "ts-e2e-conversation"
    async with client(stack) as api:
        first = await api.chat.completions.create(model="offline", user=session, messages=[{"role": "user", "content": "one"}])
        second = await api.chat.completions.create(model="offline", user=session, messages=[{"role": "user", "content": "two"}])
    entries = await stack.wait_journal(lambda es: finalized(first.id)(es) and finalized(second.id)(es))
    visits = [next(e["ts_visits"] for e in entries if e["cid"] == cid and e["hook"] == "py-probe.last") for cid in (first.id, second.id)]
    assert visits == [1, 2]  # written by TypeScript, persisted in Redis, read by Python


async def test_typescript_security_blocks_rm_rf_root_and_another_typescript_tool_runs(stack: Stack) -> None:
    async with client(stack) as api:
        blocked = await api.chat.completions.create(
            model="offline", messages=[{"role": "user", "content": "[[tool:rm_rf_root]] clean up"}]
        )
        counted = await api.chat.completions.create(
            model="offline", messages=[{"role": "user", "content": '[[tool:word_count {"text": "one two three"}]]'}]
        )
    answer = blocked.choices[0].message.content or ""
    assert "Tool call blocked by security.validateSecurity: Error: Tool blocked: rm_rf_root" in answer, answer
    assert counted.choices[0].message.content == 'The tool word_count returned: {"words":3}'

    entries = await stack.wait_journal(lambda es: finalized(blocked.id)(es) and finalized(counted.id)(es))
    refused = [e for e in entries if e["cid"] == blocked.id]
    # the chain stopped at the block (priority 1): nothing after it, and the tool never ran
    assert hooks(refused, "security", "py-probe.check_tool", "logging", "performance-monitor.start", "toolbox") == ["security.validateSecurity"]
    after = next(e for e in refused if e["hook"] == "performance-monitor.recordDuration")
    assert after["tool"] == "rm_rf_root" and after["result"].startswith("Tool call blocked by security.validateSecurity")

    ran = [e for e in entries if e["cid"] == counted.id]
    assert hooks(ran, "security", "py-probe.check_tool", "logging", "performance-monitor", "toolbox") == [
        "security.validateSecurity",  # typescript, 1
        "py-probe.check_tool",  # python, 5
        "logging.logToolUsage",  # typescript, 10
        "performance-monitor.startTimer",  # typescript, 50
        "toolbox.word_count",  # the tool, in the typescript group
        "performance-monitor.recordDuration",  # after_toolcall
    ]
    assert next(e for e in ran if e["hook"] == "toolbox.word_count")["text"] == "one two three"


async def test_typescript_payment_required_is_a_402_and_finalize_still_runs(stack: Stack) -> None:
    before = {e["cid"] for e in stack.entries() if e["hook"] == "ts-billing.charge"}
    async with client(stack, METERED_KEY) as api:
        with pytest.raises(openai.APIStatusError) as caught:
            await api.chat.completions.create(model="offline", messages=[{"role": "user", "content": "hello"}])
    assert caught.value.status_code == 402
    body = caught.value.body if isinstance(caught.value.body, dict) else json.loads(str(caught.value.body))
    error = body.get("error", body)
    assert error["code"] == "payment_required" and error["message"] == "no credit left", body

    entries = await stack.wait_journal(
        lambda es: any(e["hook"] == "ts-billing.charge" and e["cid"] not in before and finalized(e["cid"])(es) for e in es)
    )
    cid = next(e["cid"] for e in entries if e["hook"] == "ts-billing.charge" and e["cid"] not in before)
    mine = [e for e in entries if e["cid"] == cid]
    # the abort at priority 2 ended on_connection (no hook after it ran, Python's at 5
    # neither); both languages' finalize_connection hooks ran, in priority order
    assert hooks(mine) == ["ts-billing.charge", "request-logger.endLogging", "py-probe.finalize"]
    end = next(e for e in mine if e["hook"] == "request-logger.endLogging")
    assert end["error"] == {"status_code": 402, "code": "payment_required"}
    assert next(e for e in mine if e["hook"] == "py-probe.finalize")["error"] == 402


async def test_typescript_finalize_runs_when_the_model_fails(stack: Stack) -> None:
    seen = {e["cid"] for e in stack.entries()}
    async with client(stack) as api:
        with pytest.raises(openai.APIStatusError) as caught:
            await api.chat.completions.create(model="offline", messages=[{"role": "user", "content": "[[error:500]]"}])
    status = caught.value.status_code
    assert status >= 500

    def failed_run_finalized(entries: list[dict]) -> bool:
        return any(
            e["cid"] not in seen and e["hook"] == "request-logger.endLogging" and e["error"] is not None for e in entries
        )

    entries = await stack.wait_journal(failed_run_finalized)
    end = next(e for e in entries if e["cid"] not in seen and e["hook"] == "request-logger.endLogging")
    assert end["error"]["status_code"] == status


async def test_the_announcement_is_what_python_reads_and_status_lists_the_replica(stack: Stack) -> None:
    client = aredis.Redis.from_url(stack.env["REDIS_URL"])
    try:
        raw = await client.hget(Keys(stack.env["HOOKBUS_PREFIX"]).registry, "ts")
    finally:
        await client.aclose()
    assert raw is not None
    announcement = GroupAnnouncement.model_validate_json(raw)
    assert json.loads(raw)["protocol"] == PROTOCOL
    assert [h.key for h in announcement.hooks if h.lifecycle == "before_toolcall"] == [
        "security.validateSecurity", "logging.logToolUsage", "performance-monitor.startTimer",
    ]
    assert sorted(t.name for t in announcement.tools) == ["rm_rf_root", "word_count"]

    status = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("hookbus")), "status", "--json",  # the console script
        env=stack.env, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(status.communicate(), 60)
    assert status.returncode == 0, err.decode()
    groups = {g["name"]: g for g in json.loads(out)["groups"]}
    assert groups["ts"]["replicas"] == ["ts-1"] and groups["py"]["replicas"] == ["py-1"]
    assert "content-filter.filterOutput@on_chunk:5" in groups["ts"]["hooks"]
