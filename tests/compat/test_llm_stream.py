"""The LLM adapter's streamed chunks, read by the real `openai` client from a real HTTP
endpoint (the recording upstream): validated chunks, lenient ones, and the errors, on
both of the client's HTTP stacks; and the aiohttp session closed by `aclose()`."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import threading
import uuid
from collections.abc import Iterator

import pytest
from openai.types.chat import ChatCompletionChunk

from hookbus.services.orchestrator.llm.client import LLM
from hookbus.services.orchestrator.loop.agent import Agent
from hookbus.skills.errors import UpstreamError
from tests.compat import upstream as up
from tests.compat.upstream import RecordingUpstream
from tests.integration.stack import running_stack

HI = [{"role": "user", "content": "hi"}]

CALL_BOUND = 30.0
"""Seconds a call may take before it is a 504: a bound for a test that is not about time
(2 s ran out under load and turned an upstream's error event into a timeout)."""


@pytest.fixture(params=["httpx", "aiohttp"])
def http(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def streamed(recording: RecordingUpstream, *answers: up.Reply | up.Stream, http: str) -> list[ChatCompletionChunk]:
    recording.answer(*answers)
    llm = LLM(base_url=recording.url, api_key="sk-upstream", timeout=CALL_BOUND, retries=0, http=http)  # type: ignore[arg-type]
    try:
        return [chunk async for chunk in llm.stream("m", HI, None)]
    finally:
        await llm.aclose()


async def test_streamed_chunks_are_validated_by_the_chunk_model(recording, http):
    chunks = up.text_stream("one two").chunks
    chunks[1] = {**chunks[1], "created": "5"}  # the model's lax validation makes it an int
    received = await streamed(recording, up.Stream(chunks), http=http)
    assert all(type(c) is ChatCompletionChunk for c in received)
    assert received[1].created == 5
    assert "".join(c.choices[0].delta.content or "" for c in received if c.choices) == "one two"
    assert received[-1].usage is not None and received[-1].usage.total_tokens == 8


async def test_a_chunk_the_model_refuses_is_built_leniently_as_the_client_does(recording, http):
    chunks = up.text_stream("one two").chunks
    chunks[1] = {**chunks[1], "created": "soon", "timings": {"predicted_ms": 1.5}}
    received = await streamed(recording, up.Stream(chunks), http=http)
    assert received[1].created == "soon"  # type: ignore[comparison-overlap]
    assert received[1].choices[0].delta.content == "one"
    assert received[1].model_extra == {"timings": {"predicted_ms": 1.5}}


async def test_an_error_event_inside_the_stream_is_an_upstream_error(recording, http):
    chunks = up.text_stream("one two", usage=False).chunks[:2]
    chunks.append({"error": {"message": "the model fell over", "code": "server_error"}})
    with pytest.raises(UpstreamError) as caught:
        await streamed(recording, up.Stream(chunks, done=False), http=http)
    assert caught.value.status_code == 502 and caught.value.message.endswith(": the model fell over")


async def test_an_http_error_before_the_stream_keeps_its_status_and_code(recording, http):
    with pytest.raises(UpstreamError) as caught:
        await streamed(
            recording, up.error(429, "slow down", "rate_limit_exceeded", headers={"retry-after": "3"}), http=http,
        )
    assert caught.value.status_code == 429 and caught.value.code == "rate_limit_exceeded"
    assert caught.value.details["retry_after"] == "3"


class HangingUp:
    """A TCP endpoint that accepts each connection, reads the request, sends `says` (by
    default nothing) and closes it; counts the connections."""

    def __init__(self, says: bytes = b"") -> None:
        self.connections = 0
        self.says = says
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.recv(65536)
                conn.sendall(self.says)

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def hanging_up() -> Iterator[HangingUp]:
    server = HangingUp()
    yield server
    server.close()


async def completion_error(url: str, http: str, timeout: float) -> UpstreamError:
    """What `complete` raised against `url`, with 2 retries (its client closed after)."""
    llm = LLM(base_url=url, api_key="k", timeout=timeout, retries=2, http=http)  # type: ignore[arg-type]
    try:
        with pytest.raises(UpstreamError) as caught:
            await llm.complete("m", HI, None)
    finally:
        await llm.aclose()
    return caught.value


async def test_a_call_that_could_not_connect_is_retried_then_a_502(hanging_up, http):
    error = await completion_error(hanging_up.url, http, timeout=CALL_BOUND)
    assert error.status_code == 502 and error.code == "llm_unreachable"
    assert hanging_up.connections == 3  # the call and its 2 retries, no more


def _cut_stream() -> bytes:
    """A streamed answer's head and first chunk, then half a chunk: the stream is cut."""
    event = b"data: " + json.dumps(up.text_stream("one").chunks[1]).encode() + b"\n\n"
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return head + b"%x\r\n" % len(event) + event + b"\r\n" + b"40\r\nhalf"


async def test_a_stream_cut_short_is_a_502_after_the_chunks_it_brought(http):
    server = HangingUp(says=_cut_stream())
    llm = LLM(base_url=server.url, api_key="k", timeout=CALL_BOUND, retries=2, http=http)  # type: ignore[arg-type]
    received: list[ChatCompletionChunk] = []
    try:
        with pytest.raises(UpstreamError) as caught:
            async for chunk in llm.stream("m", HI, None):
                received.append(chunk)
    finally:
        await llm.aclose()
        server.close()
    assert caught.value.status_code == 502 and caught.value.code == "llm_unreachable"
    assert [c.choices[0].delta.content for c in received] == ["one"]
    assert server.connections == 1  # a generation under way is never sent again


async def test_a_timeout_is_a_504_and_never_sent_twice(recording, http):
    recording.answer(up.Reply(up.completion(), delay=1.0))
    error = await completion_error(recording.url, http, timeout=0.3)
    assert error.status_code == 504 and error.code == "llm_timeout"
    assert len(recording.received) == 1


def unclosed_after_a_loop(recording: RecordingUpstream, *, close: bool) -> tuple[list[str], int]:
    """Stream twice on a loop of its own with aiohttp (`aclose()` between the calls, and
    at the end when `close`), end the loop, collect: what the loop was told was left
    unclosed, and the words streamed."""
    told: list[str] = []
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _loop, context: told.append(str(context.get("message"))))
    llm = LLM(base_url=recording.url, api_key="sk-upstream", timeout=CALL_BOUND, retries=0, http="aiohttp")

    async def use(llm: LLM) -> int:
        words = 0
        for last in (False, True):
            recording.answer(up.text_stream("one two"))
            chunks = [chunk async for chunk in llm.stream("m", HI, None)]
            words += sum(len((c.choices[0].delta.content or "").split()) for c in chunks if c.choices)
            if close or not last:
                await llm.aclose()
        if close:
            await llm.aclose()  # a second close does nothing
        return words

    try:
        words = loop.run_until_complete(use(llm))
    finally:
        loop.close()
    del llm
    gc.collect()
    return told, words


def test_aclose_leaves_no_aiohttp_session_open(recording):
    told, words = unclosed_after_a_loop(recording, close=True)
    assert words == 4  # the call after the first close opened a new session
    assert told == []
    told, _ = unclosed_after_a_loop(recording, close=False)
    assert any("Unclosed client session" in message for message in told)  # what it prevents


async def test_the_orchestrator_service_streams_on_aiohttp_and_closes_it(redis_url, recording):
    agent = Agent("aio", model="m", llm=LLM(base_url=recording.url, api_key="k", timeout=CALL_BOUND, retries=0))
    assert agent.llm.http is None  # nothing chosen: the service picks
    async with running_stack(redis_url, f"aio{uuid.uuid4().hex[:8]}:", agent) as (client, _, _):
        assert agent.llm.http == "aiohttp"
        recording.answer(up.text_stream("one two"), up.Reply(up.completion("three")))
        chunks = [chunk async for chunk in client.stream("hi")]
        completion = await client.complete("again")
        used = agent.llm.client()  # the loop's client, the one the service's calls went through
        assert not used.is_closed()
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "one two"
    assert completion.choices[0].message.content == "three"
    assert used.is_closed()  # the service's stop closed it


async def test_services_sharing_an_agent_close_its_client_only_when_the_last_stops(redis_url, recording):
    agent = Agent("aio-shared", model="m", llm=LLM(base_url=recording.url, api_key="k", timeout=CALL_BOUND, retries=0))
    async with running_stack(redis_url, f"aio{uuid.uuid4().hex[:8]}:", agent, orchestrators=2) as (client, services, _):
        recording.answer(up.Reply(up.completion("one")))
        assert (await client.complete("hi")).choices[0].message.content == "one"
        used = agent.llm.client()
        await services[0].stop()
        assert not used.is_closed()  # the other service still calls through it
        recording.answer(up.Reply(up.completion("two")))
        assert (await client.complete("again")).choices[0].message.content == "two"
    assert used.is_closed()


async def test_an_agent_in_process_on_aiohttp_closes_its_client_when_its_block_ends(recording):
    recording.answer(up.Reply(up.completion("in process")))
    async with Agent("local", model="m", llm=LLM(base_url=recording.url, api_key="k", http="aiohttp")) as agent:
        answer = await agent.run("hi")
        used = agent.llm.client()
    assert answer.choices[0].message.content == "in process"
    assert used.is_closed()
