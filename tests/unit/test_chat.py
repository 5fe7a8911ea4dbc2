"""The chat REPL: automatic and forced compaction, /context, /new, streaming, errors;
driven through its input stream (in-process and through the queue) and through a
pseudo-terminal running the real entry point."""

from __future__ import annotations

import io
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pexpect
import pytest
import redis.asyncio as aredis

from hookbus import Agent, Compaction
from hookbus.services.cli.chat import _main, chat
from hookbus.services.orchestrator.compaction.rules import SUMMARY_HEADER
from hookbus.skills import PaymentRequired, Skill, hook
from tests.integration.stack import running_stack

REPO = Path(__file__).resolve().parents[2]
HELP = (
    "Commands: /compact [focus] (compact now), /context (how full the context is), "
    "/new (new conversation), /help, /quit"
)


class Listener(Skill):
    name = "listener"

    def __init__(self) -> None:
        self.calls: list[tuple[Compaction, Any]] = []

    async def on_compaction(self, outcome, ctx):  # type: ignore[no-untyped-def]
        self.calls.append((outcome, ctx))


def words(text: str) -> str:
    """The offline model's `[[words:N]]` answers, shortened to WORDS(N)."""
    return re.sub(r"w0( w\d+)+", lambda m: f"WORDS({m.group(0).count(' ') + 1})", text)


async def run_chat_script(target: Any, lines: list[str], **options: Any) -> tuple[int, list[str]]:
    output = io.StringIO()
    status = await chat(
        target, input_stream=io.StringIO("".join(f"{line}\n" for line in lines)), output=output,
        **options,
    )
    return status, words(output.getvalue()).split("\n")


async def test_the_local_chat_compacts_by_itself_and_on_request() -> None:
    listener = Listener()
    agent = Agent("c", model="offline-tiny", instructions="Be brief.", skills=[listener])
    status, lines = await run_chat_script(
        agent,
        [
            "[[words:250]]",
            "[[words:250]]",
            "/context",
            "[[echo]] third message",
            "/context",
            "/compact the budget decisions",
            "/new",
            "/context",
            "/help",
            "/bogus",
            "",
            "/quit",
            "never read",
        ],
        local=True,
    )
    assert status == 0
    assert lines == [
        "hookbus chat (local; model offline-tiny, window 1024 tokens). /help for commands.",
        "you> WORDS(250)",
        "you> WORDS(250)",
        "you> model: offline-tiny",
        "window: 1024 tokens",
        "used: 1033 tokens (101%) in 5 messages",
        "compacts at: 819 tokens (80%)",
        "summary carried: no",
        # before the third message, the conversation plus the message passes 819 tokens
        "you> Compacted the conversation: summarized 3 messages, kept 1. Context 55% full.",
        "third message",
        "you> model: offline-tiny",
        "window: 1024 tokens",
        "used: 579 tokens (57%) in 5 messages",
        "compacts at: 819 tokens (80%)",
        "summary carried: yes",
        "you> Compacted the conversation: summarized 2 messages, kept 2. Context 8% full.",
        "you> Started a new conversation.",
        "you> model: offline-tiny",
        "window: 1024 tokens",
        "used: 7 tokens (1%) in 1 message",
        "compacts at: 819 tokens (80%)",
        "summary carried: no",
        f"you> {HELP}",
        f"you> Unknown command /bogus. {HELP}",
        "you> you> ",
    ]
    # the chat's compactions are between turns: ctx is None; the focus reached the summary
    assert [(o.stage, ctx) for o, ctx in listener.calls] == [("summarized", None)] * 2
    forced = listener.calls[1][0]
    assert forced.messages[0] == {"role": "system", "content": "Be brief."}
    assert forced.messages[1]["content"].startswith(
        f"{SUMMARY_HEADER}\nSummary: Focus: the budget decisions. user: Conversation to summarize: [system] Summ"
    )
    assert forced.messages[2:] == [
        {"role": "user", "content": "[[echo]] third message"},
        {"role": "assistant", "content": "third message"},
    ]


async def test_end_of_input_leaves_and_compact_with_nothing_to_do_says_so() -> None:
    status, lines = await run_chat_script(Agent("c"), ["/compact", "hi"], local=True)
    assert status == 0
    assert lines == [
        "hookbus chat (local; model offline, window 128000 tokens). /help for commands.",
        "you> No compaction needed. Context 0% full.",
        "you> Offline model reply to: hi",
        "you> ",
        "",
    ]


class Paywall(Skill):
    name = "paywall"

    @hook("on_connection")
    def charge(self, data, ctx):  # type: ignore[no-untyped-def]
        text = data.messages[-1]["content"]
        if "expensive" in text:
            raise PaymentRequired("no credit left")


async def test_a_refused_message_is_reported_and_not_kept() -> None:
    agent = Agent("c", skills=[Paywall()])
    status, lines = await run_chat_script(
        agent, ["[[echo]] one", "[[echo]] expensive", "/context"], local=True
    )
    assert status == 0
    assert lines[1:4] == [
        "you> one",
        "you> error 402 payment_required: no credit left",
        "you> model: offline",
    ]
    assert lines[5].endswith("in 2 messages")  # the refused message was not kept


async def test_the_queue_chat_streams_through_the_bus_and_compacts_with_its_own_agent(
    redis_url, prefix
) -> None:
    listener = Listener()
    compactor = Agent("chat", model="offline-tiny", skills=[listener])
    served = Agent("bus", model="offline-tiny")
    async with running_stack(redis_url, prefix, served) as (client, services, _):
        status, lines = await run_chat_script(
            client,
            ["[[words:250]]", "[[words:250]]", "[[echo]] third message", "/context"],
            local=False,
            compactor=compactor,
            session_id="chat-test",
        )
    assert services[0].served == 3  # counted once acked: after the stack stopped, surely
    assert status == 0
    assert lines[:5] == [
        "hookbus chat (through the queue; model offline-tiny, window 1024 tokens). /help for commands.",
        "you> WORDS(250)",
        "you> WORDS(250)",
        # no system prompt here (the orchestrator's agent adds its own): 51%, not 52%
        "you> Compacted the conversation: summarized 3 messages, kept 1. Context 54% full.",
        "third message",
    ]
    assert lines[9] == "summary carried: yes"
    assert [(o.stage, ctx) for o, ctx in listener.calls] == [("summarized", None)]
    assert served.last_compaction is None  # the answering agent never needed to compact


def test_the_chat_wants_the_right_target() -> None:
    import asyncio

    with pytest.raises(TypeError, match="needs an Agent"):
        asyncio.run(chat(object(), local=True, input_stream=io.StringIO("")))  # type: ignore[arg-type]


async def test_the_queue_chat_without_redis_says_how_to_get_one(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    assert await _main(local=False) == 2
    assert "no Redis to talk to" in capsys.readouterr().err


def test_the_chat_in_a_pseudo_terminal(redis_url, prefix) -> None:
    env = {
        key: value for key, value in os.environ.items()
        if key not in ("HOOKBUS_LOG_LEVEL", "HOOKBUS_MEMORY_OWNER", "OPENAI_BASE_URL")
    }
    env.update(  # no OPENAI_BASE_URL: the built-in offline model, which knows its window
        HOOKBUS_MODEL="offline-tiny",
        REDIS_URL=redis_url,
        HOOKBUS_PREFIX=prefix,
        PYTHONUNBUFFERED="1",
    )
    child = pexpect.spawn(
        sys.executable,
        ["-c", "import sys; from hookbus.services.cli.chat import run_chat; sys.exit(run_chat(local=True))"],
        cwd=str(REPO), env=env, encoding="utf-8", timeout=60, dimensions=(50, 400),
    )
    try:
        child.expect_exact("window 1024 tokens). /help for commands.")
        child.expect_exact("you> ")
        for _ in range(2):
            child.sendline("[[words:250]]")
            child.expect_exact("w248 w249\r\n")
            child.expect_exact("you> ")
        child.sendline("[[echo]] third message")
        child.expect_exact(
            "Compacted the conversation: summarized 3 messages, kept 1. Context 55% full.\r\n"
        )
        child.expect_exact("third message\r\n")
        child.expect_exact("you> ")
        child.sendline("/compact the budget")
        child.expect_exact("Compacted the conversation: summarized 2 messages, kept 2.")
        child.expect_exact("you> ")
        child.sendline("/context")
        child.expect_exact("summary carried: yes\r\n")
        child.expect_exact("you> ")
        child.sendline("/quit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, child.before

    async def stored() -> list[dict[str, Any]]:
        client = aredis.Redis.from_url(redis_url)
        try:
            return [json.loads(m) for m in await client.zrange(f"{prefix}memory:owner", 0, -1)]
        finally:
            await client.aclose()

    import asyncio

    episodes = asyncio.run(stored())
    assert [(e["stage"], e["focus"]) for e in episodes] == [
        ("summarized", None), ("summarized", "the budget")
    ]
