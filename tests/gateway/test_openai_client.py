"""The official `openai` client, unchanged, against a running gateway."""

from __future__ import annotations

import uuid

import openai
import pytest

from tests.gateway.conftest import BROKE_KEY, KEY


def client_for(gateway, key: str = KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.v1, api_key=key, max_retries=0, timeout=30)


async def test_a_non_streamed_completion(gateway):
    async with client_for(gateway) as client:
        completion = await client.chat.completions.create(
            model="offline",
            messages=[{"role": "user", "content": "[[echo]] hello through the gateway"}],
            temperature=0.2,  # unknown to the gateway: accepted and ignored
            top_p=0.9,
        )
    assert completion.choices[0].message.content == "hello through the gateway"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.id.startswith("chatcmpl-")
    assert completion.model == "offline"
    assert completion.usage is not None and completion.usage.total_tokens > 0


async def test_a_streamed_completion_with_usage(gateway):
    async with client_for(gateway) as client:
        stream = await client.chat.completions.create(
            model="offline",
            messages=[{"role": "user", "content": "[[words:12]]"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == " ".join(f"w{i}" for i in range(12))
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])


async def test_a_streamed_completion_without_usage_gets_no_usage_chunk(gateway):
    async with client_for(gateway) as client:
        stream = await client.chat.completions.create(
            model="offline", messages=[{"role": "user", "content": "[[words:3]]"}], stream=True
        )
        chunks = [chunk async for chunk in stream]
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_a_tool_using_request_runs_the_worker_tool_and_the_user_field_is_the_session(gateway, sessions):
    user = f"user-{uuid.uuid4().hex[:8]}"
    async with client_for(gateway) as client:
        first = await client.chat.completions.create(
            model="offline",
            messages=[{"role": "user", "content": '[[tool:remember {"note": "buy milk"}]]'}],
            user=user,
        )
        stream = await client.chat.completions.create(
            model="offline",
            messages=[{"role": "user", "content": '[[tool:remember {"note": "call mum"}]]'}],
            user=user,
            stream=True,
        )
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert first.choices[0].message.content == "The tool remember returned: noted (1)"
    assert streamed == "The tool remember returned: noted (2)"
    data = await sessions.load("alice", user)
    assert data["notes"] == ["buy milk", "call mum"]
    assert data["peer"] == "alice"  # ctx.auth.peer_user_id from the API key


async def test_the_session_header_wins_over_the_user_field(gateway, sessions):
    sid = f"hdr-{uuid.uuid4().hex[:8]}"
    async with client_for(gateway) as client:
        await client.chat.completions.create(
            model="offline",
            messages=[{"role": "user", "content": '[[tool:remember {"note": "x"}]]'}],
            user="ignored-user",
            extra_headers={"X-Session-Id": sid},
        )
    assert (await sessions.load("alice", sid))["notes"] == ["x"]
    assert "notes" not in await sessions.load("alice", "ignored-user")


async def test_models_are_listed(gateway):
    async with client_for(gateway) as client:
        models = [m.id async for m in client.models.list()]
        one = await client.models.retrieve("offline")
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("gpt-nope")
    assert models == ["offline"]
    assert one.id == "offline" and one.owned_by == "hookbus"


async def test_errors_reach_the_openai_client_as_its_exceptions(gateway):
    async with client_for(gateway, BROKE_KEY) as client:
        with pytest.raises(openai.APIStatusError) as paid:
            await client.chat.completions.create(
                model="offline", messages=[{"role": "user", "content": "hi"}], stream=True
            )
    assert paid.value.status_code == 402
    assert paid.value.code == "payment_required"
    async with client_for(gateway, "sk-wrong") as client:
        with pytest.raises(openai.AuthenticationError):
            await client.chat.completions.create(model="offline", messages=[{"role": "user", "content": "hi"}])
    async with client_for(gateway) as client:
        with pytest.raises(openai.NotFoundError) as missing:
            await client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.code == "model_not_found"
