"""Request limits at the edge: hostile bodies get a fast 400/413, never a 500 or a stall, and
a body the gateway lets through is one the orchestrator can decode (hookbus.bus.limits)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from hookbus.bus.limits import MAX_REQUEST_BYTES, RequestLimits
from tests.gateway.conftest import bearer
from tests.gateway.server import RunningGateway, running_gateway
from tests.gateway.test_http import CHAT, assert_openai_error

LIMITS = RequestLimits()
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
async def full_size(stack: Any, redis_url: str, module_prefix: str) -> AsyncIterator[RunningGateway]:
    """A gateway with the default limits (the module's shared one takes only 64 KiB)."""
    from tests.gateway.conftest import API_KEYS

    async with running_gateway(redis_url, module_prefix, api_keys=API_KEYS, models=["offline"]) as gw:
        yield gw


@pytest.fixture
async def http(full_size: RunningGateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=full_size.url, timeout=60) as client:
        yield client


def nested(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


def chat_body(messages: list[dict[str, Any]]) -> bytes:
    return json.dumps({"model": "offline", "messages": messages}).encode()


async def post(http: httpx.AsyncClient, payload: bytes) -> httpx.Response:
    return await http.post(CHAT, content=payload, headers={**bearer(), **JSON})


async def test_123000_tiny_messages_are_refused_fast_while_another_caller_is_served(http, stack):
    payload = chat_body([{"role": "user", "content": "x"}] * 123_000)
    assert len(payload) < MAX_REQUEST_BYTES  # a legal size: the count is what is refused

    async def other_caller() -> float:
        started = time.perf_counter()
        response = await http.post(
            CHAT, json={"model": "offline", "messages": [{"role": "user", "content": "[[echo]] me too"}]},
            headers=bearer(),
        )
        assert response.status_code == 200, response.text
        return time.perf_counter() - started

    baseline = await other_caller()
    started = time.perf_counter()
    refused, meanwhile = await asyncio.gather(post(http, payload), other_caller())
    refuse_seconds = time.perf_counter() - started
    error = assert_openai_error(refused, 400, "too_many_messages")
    assert error["param"] == "messages" and "2048" in error["message"]
    assert refuse_seconds < 3.0, refuse_seconds  # parse + count: about 0.1 s
    assert meanwhile < 3.0 + baseline, (meanwhile, baseline)
    print(f"\nrefused 123,000 messages in {refuse_seconds:.3f} s; other caller {meanwhile:.3f} s "
          f"(alone {baseline:.3f} s)")


@pytest.mark.parametrize(
    ("payload", "status", "code"),
    [
        (b'{"model": "offline", "messages": [{"role": "user", "content": "\\ud800"}]}', 400, "invalid_json"),
        (b'{"model": "offline", "messages": [{"role": "user", "content": "\\udc00 x"}]}', 400, "invalid_json"),
        (b'{"model": "offline", "messages": [{"role": "user", "content": "\xff"}]}', 400, "invalid_json"),
        (b'{"model": "offline", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "too_deeply_nested"),
        (chat_body([{"role": "user", "content": "x", "extra": nested(150)}]), 400, "too_deeply_nested"),
        (chat_body([{"role": "user", "content": "x", "extra": nested(LIMITS.max_depth - 2)}]), 400, "too_deeply_nested"),
        (chat_body([{"role": "user", "content": "x"}] * (LIMITS.max_messages + 1)), 400, "too_many_messages"),
        (chat_body([{"role": "user", "content": "x" * LIMITS.max_message_bytes}]), 413, "message_too_large"),
        (chat_body([{"role": "user", "content": "x", "extra": [0] * LIMITS.max_values}]), 400, "too_many_values"),
        (chat_body([{"role": "user", "content": "x" * (LIMITS.max_message_bytes // 2)}] * 9), 413, "request_too_large"),
    ],
    ids=[
        "lone-high-surrogate", "lone-low-surrogate", "not-utf8", "5000-deep", "150-deep",
        "one-level-too-deep", "too-many-messages", "message-too-large", "too-many-values", "body-too-large",
    ],
)
async def test_a_hostile_body_gets_a_structured_400_or_413_not_a_500(http, payload, status, code):
    assert_openai_error(await post(http, payload), status, code)


async def test_a_body_at_every_limit_passes_the_gateway_and_the_orchestrator(http, stack):
    """Depth, message count and values at their limits: the orchestrator decodes and runs it."""
    client = stack[0]
    letters_before = await client.redis.xlen(client.keys.dead_letter)
    deepest = {"role": "user", "content": "x", "extra": nested(LIMITS.max_depth - 3)}  # body, messages, message
    messages: list[dict[str, Any]] = [{"role": "user", "content": "x"}] * (LIMITS.max_messages - 2)
    messages = [deepest, *messages, {"role": "user", "content": "[[echo]] all there"}]
    room = LIMITS.max_values - 3 * len(messages) - 2 - LIMITS.max_depth
    messages[1] = {"role": "user", "content": "x", "extra": [0] * room}
    response = await post(http, chat_body(messages))
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "all there"
    assert await client.redis.xlen(client.keys.dead_letter) == letters_before


async def test_the_orchestrator_holds_a_request_sent_around_the_gateway_to_the_same_limits(stack):
    """A client that writes to the queue directly (not through a gateway) meets the same limits."""
    client = stack[0]
    submitted = await client.submit([{"role": "user", "content": "x"}] * (LIMITS.max_messages + 1), stream=False)
    items = [item async for item in client.items(submitted)]
    assert items[-1].kind == "error" and items[-1].error is not None
    assert items[-1].error["status_code"] == 400 and items[-1].error["code"] == "too_many_messages"
