"""A streaming guardrail with a hold-back window, through the gateway with the `openai`
client: a phrase rejected at its last piece never reaches the client, not even its first
word; a phrase rewritten in the held text reaches it as "[filtered]"; and what the window
costs in time to first text, against the same guard without it.

The guard runs in a worker group (its on_chunk hops are batched); callers pick the
windowed or the plain guard by their API key's scope. The offline model streams the
`[[echo]]` text one word per chunk, so "top secret" arrives as " top" + " secret".

The same guards judge an answer the client asked for unstreamed (`stream: false`), the whole
text as their window, in a worker group and in-process: otherwise a client could bypass a
streaming guardrail by choosing the other mode. On_chunk hooks without a window do not run
for it, as before.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
import redis.asyncio as aredis

from hookbus import Agent
from hookbus.bus.keys import Keys
from hookbus.bus.wire.envelopes import MonitorRecord
from hookbus.services.cli.monitor import recent_events
from hookbus.skills import Context, HookData, HookError, Skill, hook
from tests.gateway.server import RunningGateway, running_gateway
from tests.integration.stack import running_stack
from tests.waiting import wait_for

HELD_KEY, PLAIN_KEY, FILTER_KEY = "sk-held", "sk-plain", "sk-filter"
WINDOW = 16
PHRASE = "top secret"
KEYS: dict[str, Any] = {
    HELD_KEY: {"peer_user_id": "held", "scopes": ["held"]},
    PLAIN_KEY: {"peer_user_id": "plain", "scopes": ["plain"]},
    FILTER_KEY: {"peer_user_id": "filter", "scopes": ["filter"]},
}
SECRET = "[[echo]] the plan is top secret and more"


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
    async with (
        running_stack(redis_url, prefix, Agent("guarded"), {"guards": [PhraseGuard(), PhraseFilter()]}),
        running_gateway(redis_url, prefix, api_keys=KEYS, models=["offline"]) as gateway,
    ):
        yield gateway


@dataclass
class Guarded:
    """A gateway whose guards run in a worker group or in-process (`in_group`), and the
    events stream that says which hops each request took."""

    gateway: RunningGateway
    redis: aredis.Redis
    keys: Keys
    in_group: bool

    async def hops_once_ended(self, completion_id: str) -> int:
        """The on_chunk hops the orchestrator sent the guards' group for the request (a stage
        record each), once it recorded the request's end after them."""

        async def records() -> list[MonitorRecord]:
            of_it = [r for r in await recent_events(self.redis, self.keys) if r.completion_id == completion_id]
            return of_it if any(r.kind == "request" for r in of_it) else []

        return sum(
            r.kind == "stage" and r.lifecycle == "on_chunk" and r.group == "guards"
            for r in await wait_for(records, timeout=10)
        )


@pytest.fixture(scope="module", params=["worker", "in-process"])
async def guards_by_place(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[Guarded]:
    """The same guards, in a worker group or in the orchestrator's process."""
    prefix = f"hb{uuid.uuid4().hex[:8]}:"
    guards = [PhraseGuard(), PhraseFilter()]
    in_group = request.param == "worker"
    agent, groups = (Agent("guarded"), {"guards": guards}) if in_group else (Agent("guarded", skills=guards), {})
    redis = aredis.Redis.from_url(redis_url)
    async with (
        running_stack(redis_url, prefix, agent, groups),
        running_gateway(redis_url, prefix, api_keys=KEYS, models=["offline"]) as gateway,
    ):
        yield Guarded(gateway, redis, Keys(prefix), in_group)
    await redis.aclose()


async def _complete(
    gateway: RunningGateway, key: str, text: str
) -> tuple[str, openai.APIStatusError | None, str | None]:
    """(the answer's text, the error the call ended with, its id) of a call with `stream: false`."""
    client = openai.AsyncOpenAI(base_url=gateway.v1, api_key=key, max_retries=0, timeout=30)
    try:
        answer = await client.chat.completions.create(
            model="offline", messages=[{"role": "user", "content": text}], stream=False
        )
    except openai.APIStatusError as exc:
        return "", exc, None
    finally:
        await client.close()
    return answer.choices[0].message.content or "", None, answer.id


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


async def test_a_non_streamed_answer_is_refused_with_the_streams_error(guards_by_place):
    gateway = guards_by_place.gateway
    _, _, streamed = await _stream(gateway, HELD_KEY, SECRET)
    text, unstreamed, _ = await _complete(gateway, HELD_KEY, SECRET)
    assert isinstance(streamed, openai.APIError) and unstreamed is not None
    assert text == ""
    assert unstreamed.status_code == 451
    assert (unstreamed.code, unstreamed.message) == (streamed.code, streamed.message)
    assert unstreamed.code == "content_blocked"
    # an answer the guard finds nothing in passes, whole
    clean, error, _ = await _complete(gateway, HELD_KEY, "[[echo]] the plan is public")
    assert (clean, error) == ("the plan is public", None)


async def test_a_non_streamed_answer_carries_the_rewrite_as_a_stream_does(guards_by_place):
    gateway = guards_by_place.gateway
    streamed, _, stream_error = await _stream(gateway, FILTER_KEY, SECRET)
    text, error, completion_id = await _complete(gateway, FILTER_KEY, SECRET)
    assert stream_error is None and error is None and completion_id is not None
    assert text == streamed == "the plan is [filtered] and more"
    assert await guards_by_place.hops_once_ended(completion_id) == (1 if guards_by_place.in_group else 0)


async def test_on_chunk_hooks_without_a_window_run_for_streams_only(guards_by_place):
    """The plain guard refuses the phrase in a stream; an unstreamed answer has no chunks
    for it (docs/hooks.md, on_chunk), so it arrives whole, and not one hop goes out for it."""
    gateway = guards_by_place.gateway
    _, _, streamed = await _stream(gateway, PLAIN_KEY, SECRET)
    text, error, completion_id = await _complete(gateway, PLAIN_KEY, SECRET)
    assert streamed is not None
    assert (text, error) == ("the plan is top secret and more", None)
    assert completion_id is not None
    assert await guards_by_place.hops_once_ended(completion_id) == 0
