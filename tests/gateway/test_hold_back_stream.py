"""A streaming guardrail with a hold-back window, through the gateway with the `openai`
client: a phrase rejected at its last piece never reaches the client, not even its first
word; a phrase rewritten in the held text reaches it as "[filtered]"; and what the window
costs in time to first text, against the same guard without it.

The guard runs in a worker group (its on_chunk hops are batched); callers pick the
windowed or the plain guard by their API key's scope. The offline model streams the
`[[echo]]` text one word per chunk, so "top secret" arrives as " top" + " secret".
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from hookbus import Agent
from hookbus.skills import Context, HookData, HookError, Skill, hook
from tests.gateway.server import RunningGateway, running_gateway
from tests.integration.stack import running_stack

HELD_KEY, PLAIN_KEY, FILTER_KEY = "sk-held", "sk-plain", "sk-filter"
WINDOW = 16
PHRASE = "top secret"


class PhraseGuard(Skill):
    """The same check twice: with a window (scope `held`) and without (scope `plain`)."""

    name = "phrase-guard"

    @staticmethod
    def _judge(data: HookData) -> None:
        if PHRASE in (data.full_content or ""):
            raise HookError(451, "content_blocked", "the answer contained a blocked phrase")

    @hook("on_chunk", scope="held", hold_back=WINDOW)
    async def held(self, data: HookData, ctx: Context) -> None:
        self._judge(data)

    @hook("on_chunk", scope="plain")
    async def plain(self, data: HookData, ctx: Context) -> None:
        self._judge(data)


class PhraseFilter(Skill):
    """Replaces the phrase with "[filtered]" once its last piece came, in the held text."""

    name = "phrase-filter"

    @hook("on_chunk", scope="filter", hold_back=WINDOW)
    async def rewrite(self, data: HookData, ctx: Context) -> None:
        text = (data.held or "") + (data.content or "")
        if PHRASE in text:
            data.held = text.replace(PHRASE, "[filtered]")
            data.content = ""


@pytest.fixture(scope="module")
async def guarded_gateway(redis_url: str) -> AsyncIterator[RunningGateway]:
    prefix = f"hb{uuid.uuid4().hex[:8]}:"
    keys: dict[str, Any] = {
        HELD_KEY: {"peer_user_id": "held", "scopes": ["held"]},
        PLAIN_KEY: {"peer_user_id": "plain", "scopes": ["plain"]},
        FILTER_KEY: {"peer_user_id": "filter", "scopes": ["filter"]},
    }
    async with (
        running_stack(redis_url, prefix, Agent("guarded"), {"guards": [PhraseGuard(), PhraseFilter()]}),
        running_gateway(redis_url, prefix, api_keys=keys, models=["offline"]) as gateway,
    ):
        yield gateway


async def _stream(gateway: RunningGateway, key: str, text: str) -> tuple[str, float, BaseException | None]:
    """(the text the client received, seconds to its first text, the error that ended it)."""
    client = openai.AsyncOpenAI(base_url=gateway.v1, api_key=key, max_retries=0, timeout=30)
    received: list[str] = []
    first: float | None = None
    began = time.perf_counter()
    error: BaseException | None = None
    try:
        stream = await client.chat.completions.create(
            model="offline", messages=[{"role": "user", "content": text}], stream=True
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter() - began
                received.append(chunk.choices[0].delta.content)
    except openai.APIError as exc:
        error = exc
    finally:
        await client.close()
    return "".join(received), first if first is not None else float("inf"), error


async def test_no_byte_of_a_phrase_rejected_at_its_last_piece_reaches_the_client(guarded_gateway):
    text, _, error = await _stream(guarded_gateway, HELD_KEY, "[[echo]] the plan is top secret and more")
    assert error is not None and "blocked phrase" in str(error)
    assert "top" not in text and "secret" not in text
    assert "the plan is".startswith(text.strip()) or text == ""
    # the same guard without a window: the phrase's first word was on the client already
    leaked, _, plain_error = await _stream(guarded_gateway, PLAIN_KEY, "[[echo]] the plan is top secret and more")
    assert plain_error is not None and leaked.endswith(" top")


async def test_a_phrase_rewritten_in_the_held_text_reaches_the_client_as_filtered(guarded_gateway):
    text, _, error = await _stream(guarded_gateway, FILTER_KEY, "[[echo]] the plan is top secret and more")
    assert error is None
    assert text == "the plan is [filtered] and more"
    # the hops were batched: the rewrite held whole batches, and a later stream is untouched
    clean, _, _ = await _stream(guarded_gateway, FILTER_KEY, "[[words:30]]")
    assert clean == " ".join(f"w{n}" for n in range(30))


async def test_the_window_costs_time_to_first_text_only(guarded_gateway, capsys):
    prompt = "[[delay:20]] [[words:40]]"
    plain, held = [], []
    for _ in range(5):
        text_plain, first_plain, _ = await _stream(guarded_gateway, PLAIN_KEY, prompt)
        text_held, first_held, _ = await _stream(guarded_gateway, HELD_KEY, prompt)
        assert text_plain == text_held == " ".join(f"w{n}" for n in range(40))
        plain.append(first_plain)
        held.append(first_held)
    ratio = statistics.median(held) / statistics.median(plain)
    with capsys.disabled():
        print(f"\n[hold-back] time to first text, model 20 ms/chunk, window {WINDOW} chars: "
              f"plain {statistics.median(plain) * 1000:.0f} ms, held {statistics.median(held) * 1000:.0f} ms, "
              f"ratio {ratio:.2f}")
    assert ratio > 1.0  # the window holds the first text until 16 more characters came
