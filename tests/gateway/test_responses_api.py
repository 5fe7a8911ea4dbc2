"""The OpenAI Responses API through the gateway, with the official `openai` client unchanged.

The stack is the gateway tests' one (tests/gateway/conftest.py) plus `Recorder`, a worker
skill that notes which lifecycle points ran for a session, so each test can check that a
response runs the same lifecycle as a chat completion, finalize included. Every object and
stream event the gateway sends is validated with the SDK's own types (strictly, not the
SDK's lenient parsing).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from hookbus import Agent
from hookbus.skills import Context, HookData, Skill, hook
from tests.gateway.conftest import (
    BROKE_KEY,
    KEY,
    TRIP_KEY,
    Billing,
    Ledger,
    Notes,
    Tripwire,
    bearer,
)
from tests.gateway.test_ops import sample
from tests.integration.stack import running_stack
from tests.waiting import wait_for

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


class Recorder(Skill):
    """Notes in the session which lifecycle points ran (on_chunk counted, not listed)."""

    name = "recorder"

    def _note(self, ctx: Context, lifecycle: str) -> None:
        if ctx.session.id:
            ctx.session.data.setdefault("seen", []).append(lifecycle)
            ctx.session.data["completion_id"] = ctx.metadata.completion_id

    @hook("on_connection", 90)
    async def connection(self, data: HookData, ctx: Context) -> None:
        self._note(ctx, "on_connection")

    @hook("before_llm_call", 90)
    async def before_llm(self, data: HookData, ctx: Context) -> None:
        self._note(ctx, "before_llm_call")

    @hook("after_llm_call", 90)
    async def after_llm(self, data: HookData, ctx: Context) -> None:
        self._note(ctx, "after_llm_call")

    @hook("on_chunk", 90)
    async def chunk(self, data: HookData, ctx: Context) -> None:
        if ctx.session.id:
            ctx.session.data["chunks"] = ctx.session.data.get("chunks", 0) + 1

    @hook("on_message", 90)
    async def message(self, data: HookData, ctx: Context) -> None:
        self._note(ctx, "on_message")

    @hook("finalize_connection", 90)
    async def finalize(self, data: HookData, ctx: Context) -> None:
        self._note(ctx, "finalize_connection")


@pytest.fixture(scope="module")
async def stack(redis_url: str, module_prefix: str) -> AsyncIterator[Any]:
    groups = {"billing": [Billing(), Ledger(), Recorder()], "tools": [Notes(), Tripwire()]}
    async with running_stack(redis_url, module_prefix, Agent("responses-test"), groups) as running:
        yield running


def client_for(gateway, key: str = KEY, session: str | None = None) -> openai.AsyncOpenAI:
    headers = {"X-Session-Id": session} if session else None
    return openai.AsyncOpenAI(
        base_url=gateway.v1, api_key=key, max_retries=0, timeout=30, default_headers=headers
    )


def new_session() -> str:
    return f"resp-{uuid.uuid4().hex[:10]}"


async def strictly(client: openai.AsyncOpenAI, **request: Any) -> Response:
    """`responses.create`, the raw JSON validated strictly with the SDK's Response type."""
    raw = await client.responses.with_raw_response.create(**request)
    return Response.model_validate(json.loads(raw.http_response.text))


async def finalized(sessions, session: str, owner: str = "alice") -> dict[str, Any]:
    """The session's data once finalize ran (sessions belong to their principal)."""

    async def done() -> dict[str, Any] | None:
        data = await sessions.load(owner, session)
        return data if data.get("finalized") else None

    return await wait_for(done, timeout=10) or {}


LIFECYCLE = ["on_connection", "before_llm_call", "after_llm_call", "on_message", "finalize_connection"]


# ------------------------------------------------------------------ not streamed


async def test_a_response_runs_the_whole_lifecycle_and_comes_back_as_a_response(gateway, sessions):
    session = new_session()
    async with client_for(gateway, session=session) as client:
        response = await strictly(
            client, model="offline", input="[[echo]] hello through responses",
            metadata={"ticket": "T-1"}, temperature=0.3,
        )
    assert response.id.startswith("resp_")
    assert response.status == "completed"
    assert response.output_text == "hello through responses"
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant" and message.status == "completed"
    assert response.metadata == {"ticket": "T-1"} and response.temperature == 0.3
    assert response.usage is not None
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    data = await finalized(sessions, session)
    assert data["seen"] == LIFECYCLE
    assert data["completion_id"] == response.id and data["error"] is None


async def test_input_items_and_instructions_reach_the_agent_as_messages(gateway):
    async with client_for(gateway) as client:
        response = await strictly(
            client, model="offline", instructions="You are terse.",
            input=[
                {"role": "user", "content": [{"type": "input_text", "text": "first question"}]},
                {"type": "message", "role": "assistant", "content": [
                    {"type": "output_text", "text": "first answer", "annotations": []}
                ]},
                {"role": "user", "content": "[[summarize]]"},
            ],
        )
    # the offline model's summary lists the conversation it was sent
    assert response.output_text == "Summary: user: first question; assistant: first answer"


async def test_a_function_call_output_without_its_call_is_a_400(gateway):
    async with client_for(gateway) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(
                model="offline",
                input=[{"type": "function_call_output", "call_id": "call_nowhere", "output": "42"}],
            )
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == "input"


async def test_errors_have_openai_shape_and_chat_completions_statuses(gateway):
    async with client_for(gateway, key="sk-wrong") as client:
        with pytest.raises(openai.AuthenticationError):
            await client.responses.create(model="offline", input="hi")
    async with client_for(gateway, key=BROKE_KEY) as client:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.responses.create(model="offline", input="hi")
        assert caught.value.status_code == 402
        assert caught.value.body["code"] == "payment_required"
        with pytest.raises(openai.APIStatusError) as caught:  # before the first event: a real 402
            await client.responses.create(model="offline", input="hi", stream=True)
        assert caught.value.status_code == 402
    async with client_for(gateway) as client:
        with pytest.raises(openai.NotFoundError) as not_found:
            await client.responses.create(model="no-such-model", input="hi")
        assert not_found.value.body["code"] == "model_not_found"
        with pytest.raises(openai.BadRequestError) as invalid:
            await client.responses.create(model="offline", input="hi", temperature=5)
        assert invalid.value.body["param"] == "temperature"
        with pytest.raises(openai.BadRequestError) as unsupported:
            await client.responses.create(model="offline", input="hi", tools=[{"type": "web_search"}])
        assert unsupported.value.body["param"].startswith("tools")


# -------------------------------------------------------------------- streamed


async def test_a_streamed_response_has_the_standard_events_in_sequence(gateway, sessions):
    session = new_session()
    client = client_for(gateway, session=session)
    async with client, client.responses.stream(model="offline", input="[[words:12]]") as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) >= 2
    assert "".join(deltas) == final.output_text == " ".join(f"w{i}" for i in range(12))
    assert final.status == "completed" and final.id == events[0].response.id
    assert final.usage is not None and final.usage.output_tokens > 0
    data = await finalized(sessions, session)
    assert data["seen"] == LIFECYCLE and data["completion_id"] == final.id
    assert data["chunks"] >= len(deltas)


async def test_every_stream_event_is_a_valid_sdk_event_named_by_its_type(gateway):
    request = {"model": "offline", "stream": True, "input": "[[words:5]]"}
    http = httpx.AsyncClient(base_url=gateway.url, timeout=30)
    async with http, http.stream("POST", "/v1/responses", json=request, headers=bearer()) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        body = (await response.aread()).decode()
    frames = [frame.split("\n") for frame in body.strip().split("\n\n")]
    assert frames and all(len(lines) == 2 for lines in frames)
    for event_line, data_line in frames:
        event = EVENTS.validate_json(data_line.removeprefix("data: "))
        assert event_line == f"event: {event.type}"
    assert frames[-1][0] == "event: response.completed"


async def test_an_error_after_streaming_started_is_an_error_event_then_response_failed(gateway, sessions):
    session = new_session()
    async with client_for(gateway, key=TRIP_KEY, session=session) as client:
        stream = await client.responses.create(model="offline", input="[[words:20]]", stream=True)
        events = [event async for event in stream]
    for event in events:
        EVENTS.validate_python(event.model_dump(mode="json", by_alias=True))
    assert events[0].type == "response.created"
    error, failed = events[-2:]
    assert error.type == "error" and error.code == "tripped"
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert failed.response.error is not None and failed.response.error.code == "server_error"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    data = await finalized(sessions, session, owner="carol")
    assert data["error"] == 503 and data["seen"][-1] == "finalize_connection"


async def test_a_disconnect_mid_stream_cancels_the_run_and_finalize_runs_once(gateway, stack, sessions):
    client = stack[0]
    session = new_session()
    request = {"model": "offline", "stream": True, "input": "[[words:2000]] [[delay:5]]"}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http, http.stream(
        "POST", "/v1/responses", json=request, headers={**bearer(), "X-Session-Id": session},
    ) as response:
        assert response.status_code == 200
        response_id = response.headers["x-hookbus-completion-id"]
        deltas = 0
        async for line in response.aiter_lines():
            if line.startswith("event: response.output_text.delta"):
                deltas += 1
                if deltas >= 3:
                    break  # leaving the blocks closes the connection mid-stream
    assert await wait_for(lambda: client.redis.exists(client.keys.cancel(response_id)), timeout=3)
    data = await finalized(sessions, session)
    assert data["error"] == 499 and data["completion_id"] == response_id
    await asyncio.sleep(1.0)  # a "nothing more happens" check: no second finalize within a second
    assert (await sessions.load("alice", session))["finalized"] == 1, "finalize_connection ran more than once"


async def test_a_client_that_gives_up_on_a_non_streamed_response_cancels_it(gateway, sessions):
    session = new_session()
    request = {"model": "offline", "input": "[[delay:3000]] slow answer"}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=0.5) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post("/v1/responses", json=request, headers={**bearer(), "X-Session-Id": session})
    data = await finalized(sessions, session)  # well before the model's 3 s
    assert data["error"] == 499 and data["seen"][-1] == "finalize_connection"


# ------------------------------------------------------------ stored responses


async def test_previous_response_id_continues_the_conversation(gateway):
    async with client_for(gateway) as client:
        first = await client.responses.create(
            model="offline", input="[[echo]] my name is Ada", instructions="Only for the first.",
        )
        second = await client.responses.create(
            model="offline", input="[[summarize]]", previous_response_id=first.id,
        )
        async with client.responses.stream(
            model="offline", input="[[summarize]]", previous_response_id=second.id,
        ) as stream:
            third = await stream.get_final_response()
    # the agent saw the earlier turns; the first response's instructions did not carry over
    assert second.output_text == "Summary: user: [[echo]] my name is Ada; assistant: my name is Ada"
    assert second.previous_response_id == first.id
    assert third.output_text.startswith(
        "Summary: user: [[echo]] my name is Ada; assistant: my name is Ada; assistant: Summary: user:"
    )


async def test_a_stored_response_is_read_and_deleted_by_its_owner_only(gateway):
    async with client_for(gateway) as alice, client_for(gateway, key=TRIP_KEY) as carol:
        created = await alice.responses.create(model="offline", input="[[echo]] keep me")
        fetched = await alice.responses.retrieve(created.id)
        assert fetched.id == created.id and fetched.output_text == "keep me"
        with pytest.raises(openai.NotFoundError):
            await carol.responses.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            await carol.responses.delete(created.id)
        with pytest.raises(openai.NotFoundError) as caught:
            await carol.responses.create(model="offline", input="hi", previous_response_id=created.id)
        assert caught.value.body["param"] == "previous_response_id"
        assert (await alice.responses.retrieve(created.id)).id == created.id  # carol changed nothing
        await alice.responses.delete(created.id)
        with pytest.raises(openai.NotFoundError):
            await alice.responses.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            await alice.responses.create(model="offline", input="hi", previous_response_id=created.id)


async def test_store_false_keeps_nothing(gateway, stack):
    async with client_for(gateway) as client:
        response = await client.responses.create(model="offline", input="[[echo]] forget me", store=False)
        assert response.output_text == "forget me" and response.store is False
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(response.id)


async def test_a_stored_response_expires_and_belongs_to_its_principal_in_redis(gateway, stack):
    client = stack[0]
    async with client_for(gateway) as alice:
        created = await alice.responses.create(model="offline", input="[[echo]] ttl")
    (key,) = await client.redis.keys(f"{client.keys.prefix}stored-response:*:{created.id}")
    assert 0 < await client.redis.ttl(key) <= 30 * 24 * 3600
    stored = json.loads(await client.redis.get(key))
    assert stored["response"]["id"] == created.id
    # the answer is kept once, in the response; the conversation is what came before it
    assert stored["messages"] == [{"role": "user", "content": "[[echo]] ttl"}] and stored["answer_apart"]
    assert stored["response"]["output"][0]["content"][0]["text"] == "ttl"


async def test_responses_are_counted_by_route_template_not_by_id(gateway):
    async with client_for(gateway) as client:
        created = await client.responses.create(model="offline", input="[[echo]] count me")
        await client.responses.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve("resp_missing")
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        text = (await http.get("/metrics")).text
    assert sample(text, "hookbus_gateway_requests_total", method="POST", path="/v1/responses", status="200") >= 1
    template = "/v1/responses/{response_id}"
    assert sample(text, "hookbus_gateway_requests_total", method="GET", path=template, status="200") >= 1
    assert sample(text, "hookbus_gateway_requests_total", method="GET", path=template, status="404") >= 1
    assert created.id not in text
    assert sample(text, "hookbus_gateway_in_flight_requests") == 0



# ------------------------------------------------------- function tools (client tools)

LOOKUP = {
    "type": "function", "name": "lookup", "description": "Look something up.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
}


async def test_a_function_call_is_returned_and_its_output_continues_from_the_stored_response(gateway, sessions):
    session = new_session()
    async with client_for(gateway, session=session) as client:
        asked = await strictly(
            client, model="offline", input='[[tool:lookup {"q": "tides"}]]', tools=[LOOKUP],
        )
        (call,) = asked.output
        assert call.type == "function_call" and call.name == "lookup"
        assert json.loads(call.arguments) == {"q": "tides"}
        assert asked.output_text == ""
        answered = await strictly(
            client, model="offline", previous_response_id=asked.id, tools=[LOOKUP],
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "high at noon"}],
        )
    assert answered.output_text == "The tool lookup returned: high at noon"
    data = await finalized(sessions, session)
    assert data["finalized"] == 2 and data["error"] is None


async def test_a_streamed_function_call_has_its_argument_events_and_the_full_input_continues_it(gateway):
    prompt = '[[tool:lookup {"q": "a rather long question to split"}]]'
    async with client_for(gateway) as client:
        stream = await client.responses.create(model="offline", input=prompt, tools=[LOOKUP], stream=True)
        events = [event async for event in stream]
        kinds = [e.type for e in events]
        assert "response.output_text.delta" not in kinds
        added = next(e for e in events if e.type == "response.output_item.added")
        assert added.item.type == "function_call" and added.item.name == "lookup"
        deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
        (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert "".join(deltas) == done.arguments
        assert json.loads(done.arguments) == {"q": "a rather long question to split"}
        final = events[-1].response
        assert events[-1].type == "response.completed" and final.output[0].arguments == done.arguments
        # no previous_response_id: the client sends the whole conversation back, as the Agents SDK does
        call = final.output[0]
        answered = await client.responses.create(
            model="offline", tools=[LOOKUP], store=False,
            input=[
                {"role": "user", "content": prompt},
                {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
                {"type": "function_call_output", "call_id": call.call_id, "output": "42"},
            ],
        )
    assert answered.output_text == "The tool lookup returned: 42"


async def test_tool_choice_none_keeps_the_tools_from_the_model(gateway):
    async with client_for(gateway) as client:
        response = await client.responses.create(
            model="offline", input='[[tool:lookup {"q": "x"}]] [[echo]] no call', tools=[LOOKUP],
            tool_choice="none",
        )
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == "no call"


@pytest.mark.parametrize("stream", [False, True])
async def test_the_agents_own_tool_round_is_not_an_output_item(gateway, stream):
    prompt = '[[tool:remember {"note": "eggs"}]]'
    headers = {**bearer(), "X-Session-Id": new_session()}
    request = {"model": "offline", "input": prompt, "tools": [LOOKUP], "stream": stream}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        answer = await http.post("/v1/responses", json=request, headers=headers)
    if stream:
        comments = [line for line in answer.text.splitlines() if line.startswith(": ")]
        assert comments == [": hookbus: tool remember running", ": hookbus: tool remember done"]
        frames = [f for f in answer.text.split("\n\n") if f.startswith("event: ")]
        events = [EVENTS.validate_json(f.split("\n")[1].removeprefix("data: ")) for f in frames]
        assert not [e for e in events if e.type.startswith("response.function_call_arguments")]
        response = events[-1].response
    else:
        response = Response.model_validate(answer.json())
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == "The tool remember returned: noted (1)"


async def test_a_mixed_response_runs_the_server_tool_and_returns_the_function_call(gateway, sessions):
    session = new_session()
    prompt = '[[tool:remember {"note": "milk"}]] [[tool:lookup {"q": "shops"}]]'
    async with client_for(gateway, session=session) as client:
        asked = await client.responses.create(model="offline", input=prompt, tools=[LOOKUP])
        # the agent ran its own tool (remember); only the client's call comes back
        assert [(item.type, item.name) for item in asked.output] == [("function_call", "lookup")]
        answered = await client.responses.create(
            model="offline", previous_response_id=asked.id, tools=[LOOKUP],
            input=[{"type": "function_call_output", "call_id": asked.output[0].call_id, "output": "two"}],
        )
    # the model sees the results of both its calls, the server's included
    assert answered.output_text == "The tool remember returned: noted (1)\nThe tool lookup returned: two"
    assert (await sessions.load("alice", session))["notes"] == ["milk"]


@pytest.mark.parametrize("stream", [False, True])
async def test_an_upstream_429_is_a_429(gateway, stream):
    async with client_for(gateway) as client:
        with pytest.raises(openai.RateLimitError) as caught:
            await client.responses.create(model="offline", input="[[error:429]]", stream=stream)
    assert caught.value.status_code == 429
