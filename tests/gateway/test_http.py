"""Raw HTTP against the gateway: auth, bad bodies, sizes, structured errors, SSE framing."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.gateway.conftest import BROKE_KEY, MAX_BODY, TRIP_KEY, bearer

CHAT = "/v1/chat/completions"


def body(content: str = "hi", **extra) -> dict:
    return {"model": "offline", "messages": [{"role": "user", "content": content}], **extra}


@pytest.fixture
async def http(gateway):
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        yield client


def assert_openai_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code", "param"}
    assert error["code"] == code and error["message"]
    return error


def sse_data(text: str) -> list[str]:
    """The `data:` payloads of an SSE body, checking the framing on the way."""
    assert text.endswith("\n\n")
    events = text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events), events
    return [e.removeprefix("data: ") for e in events]


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({}, "missing_api_key"),
        ({"Authorization": "Bearer sk-not-a-key"}, "invalid_api_key"),
        ({"Authorization": "Basic c2stdGVzdC1hbGljZQ=="}, "missing_api_key"),
        ({"Authorization": "Bearer"}, "missing_api_key"),
    ],
)
async def test_a_missing_or_wrong_key_gets_401(http, headers, code):
    response = await http.post(CHAT, json=body(), headers=headers)
    error = assert_openai_error(response, 401, code)
    assert error["type"] == "authentication_error"
    assert response.headers["www-authenticate"] == "Bearer"
    assert_openai_error(await http.get("/v1/models", headers=headers), 401, code)


async def test_health_and_metrics_need_no_key(http):
    assert (await http.get("/healthz")).status_code == 200
    assert (await http.get("/metrics")).status_code == 200


@pytest.mark.parametrize(
    ("payload", "param", "words"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"", None, "no body"),
        (b"[1, 2]", None, "JSON object"),
        (json.dumps({"model": "offline"}).encode(), "messages", "messages: Field required"),
        (json.dumps({"model": "offline", "messages": []}).encode(), "messages", "at least 1 item"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(), "model", "model: Field required"),
        (
            json.dumps({"model": "offline", "messages": [{"role": "wizard", "content": "x"}]}).encode(),
            "messages.0.role", "messages.0.role",
        ),
        (
            json.dumps({"model": "offline", "messages": [{"role": "user", "content": 5}]}).encode(),
            "messages.0.content.str", "messages.0.content",
        ),
        (
            json.dumps({"model": "offline", "stream": "maybe", "messages": [{"role": "user", "content": "x"}]}).encode(),
            "stream", "stream",
        ),
        (
            json.dumps({"model": "offline", "messages": [{"role": "tool", "tool_call_id": "c1", "content": "x"}]}).encode(),
            "messages", "must be a response to a preceding message with 'tool_calls'",
        ),
    ],
)
async def test_an_invalid_body_gets_400_saying_what_is_wrong(http, payload, param, words):
    response = await http.post(
        CHAT, content=payload, headers={**bearer(), "content-type": "application/json"}
    )
    error = assert_openai_error(response, 400, response.json()["error"]["code"])
    assert error["type"] == "invalid_request_error"
    assert words in error["message"], error["message"]
    if param is not None:
        assert error["param"] == param


async def test_unknown_openai_fields_are_accepted(http):
    response = await http.post(
        CHAT,
        json=body(
            "[[echo]] fine", temperature=0.5, max_tokens=10, n=1, presence_penalty=0,
            tools=[{"type": "function", "function": {"name": "f"}}], seed=1, response_format={"type": "text"},
            logit_bias={}, some_future_field={"x": 1},
        ),
        headers=bearer(),
    )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "fine"
    assert response.headers["x-hookbus-completion-id"] == response.json()["id"]


async def test_an_unknown_model_gets_404(http):
    error = assert_openai_error(
        await http.post(CHAT, json={**body(), "model": "gpt-9"}, headers=bearer()), 404, "model_not_found"
    )
    assert error["param"] == "model" and "gpt-9" in error["message"]


async def test_an_oversized_body_gets_413_by_content_length(http):
    big = body("x" * (MAX_BODY + 10))
    error = assert_openai_error(await http.post(CHAT, json=big, headers=bearer()), 413, "request_too_large")
    assert str(MAX_BODY) in error["message"]


async def test_an_oversized_body_gets_413_when_it_has_no_content_length(http):
    async def chunks():
        yield b'{"model": "offline", "messages": [{"role": "user", "content": "'
        for _ in range(20):
            yield b"x" * 8192
        yield b'"}]}'

    response = await http.post(
        CHAT, content=chunks(), headers={**bearer(), "content-type": "application/json"}
    )
    assert "content-length" not in response.request.headers
    assert_openai_error(response, 413, "request_too_large")


async def test_a_402_before_the_first_chunk_is_a_402_response_not_a_stream(http):
    response = await http.post(CHAT, json=body("hi", stream=True), headers=bearer(BROKE_KEY))
    error = assert_openai_error(response, 402, "payment_required")
    assert error["type"] == "payment_required"
    assert error["message"] == "no credit left"
    assert error["details"] == {"balance": 0}
    not_streamed = await http.post(CHAT, json=body("hi"), headers=bearer(BROKE_KEY))
    assert_openai_error(not_streamed, 402, "payment_required")


async def test_an_error_after_streaming_started_is_an_error_event_then_done(http):
    response = await http.post(CHAT, json=body("[[words:10]]", stream=True), headers=bearer(TRIP_KEY))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    data = sse_data(response.text)
    assert data[-1] == "[DONE]"
    error = json.loads(data[-2])["error"]
    assert error["code"] == "tripped" and error["message"] == "tripped after streaming started"
    chunks = [json.loads(d) for d in data[:-2]]
    assert len(chunks) == 3  # chunks 0..2 went out; the hook raised at chunk 3
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


async def test_a_stream_is_framed_as_server_sent_events(http):
    response = await http.post(CHAT, json=body("[[words:4]]", stream=True), headers=bearer())
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert response.headers["cache-control"] == "no-cache"
    data = sse_data(response.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert {c["id"] for c in chunks} == {response.headers["x-hookbus-completion-id"]}
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "w0 w1 w2 w3"


async def test_the_session_header_is_checked(http):
    response = await http.post(CHAT, json=body(), headers={**bearer(), "X-Session-Id": "s" * 201})
    error = assert_openai_error(response, 400, "invalid_session_id")
    assert error["param"] == "X-Session-Id"


async def test_unknown_paths_and_methods_get_openai_style_errors(http):
    assert_openai_error(await http.get("/v1/nope", headers=bearer()), 404, "not_found")
    assert_openai_error(await http.get(CHAT, headers=bearer()), 405, "method_not_allowed")


async def test_the_openapi_document_is_served(http):
    document = (await http.get("/openapi.json")).json()
    assert document["openapi"].startswith("3.1")
    request = document["components"]["schemas"]["ChatCompletionRequest"]
    assert request["properties"]["model"]["enum"] == ["offline"]
    assert "/v1/chat/completions" in document["paths"]
