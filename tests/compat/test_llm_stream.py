"""The LLM adapter's streamed chunks, read by the real `openai` client from a real HTTP
endpoint (the recording upstream): validated chunks, lenient ones, and the errors."""

from __future__ import annotations

import pytest
from openai.types.chat import ChatCompletionChunk

from hookbus.services.orchestrator.llm import LLM
from hookbus.skills.errors import UpstreamError
from tests.compat import upstream as up
from tests.compat.upstream import RecordingUpstream

HI = [{"role": "user", "content": "hi"}]


async def streamed(recording: RecordingUpstream, *answers: up.Reply | up.Stream) -> list[ChatCompletionChunk]:
    recording.answer(*answers)
    llm = LLM(base_url=recording.url, api_key="sk-upstream", timeout=2.0, retries=0)
    return [chunk async for chunk in llm.stream("m", HI, None)]


async def test_streamed_chunks_are_validated_by_the_chunk_model(recording):
    chunks = up.text_stream("one two").chunks
    chunks[1] = {**chunks[1], "created": "5"}  # the model's lax validation makes it an int
    received = await streamed(recording, up.Stream(chunks))
    assert all(type(c) is ChatCompletionChunk for c in received)
    assert received[1].created == 5
    assert "".join(c.choices[0].delta.content or "" for c in received if c.choices) == "one two"
    assert received[-1].usage is not None and received[-1].usage.total_tokens == 8


async def test_a_chunk_the_model_refuses_is_built_leniently_as_the_client_does(recording):
    chunks = up.text_stream("one two").chunks
    chunks[1] = {**chunks[1], "created": "soon", "timings": {"predicted_ms": 1.5}}
    received = await streamed(recording, up.Stream(chunks))
    assert received[1].created == "soon"  # type: ignore[comparison-overlap]
    assert received[1].choices[0].delta.content == "one"
    assert received[1].model_extra == {"timings": {"predicted_ms": 1.5}}


async def test_an_error_event_inside_the_stream_is_an_upstream_error(recording):
    chunks = up.text_stream("one two", usage=False).chunks[:2]
    chunks.append({"error": {"message": "the model fell over", "code": "server_error"}})
    with pytest.raises(UpstreamError) as caught:
        await streamed(recording, up.Stream(chunks, done=False))
    assert caught.value.status_code == 502 and caught.value.message.endswith(": the model fell over")


async def test_an_http_error_before_the_stream_keeps_its_status_and_code(recording):
    with pytest.raises(UpstreamError) as caught:
        await streamed(recording, up.error(429, "slow down", "rate_limit_exceeded", headers={"retry-after": "3"}))
    assert caught.value.status_code == 429 and caught.value.code == "rate_limit_exceeded"
    assert caught.value.details["retry_after"] == "3"
