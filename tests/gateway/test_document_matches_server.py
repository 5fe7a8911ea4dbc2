"""The gateway's OpenAPI document says what the server accepts: bodies the server refuses
are refused by the document's schemas too, and `OPTIONS` names every method a path serves."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from hookbus.services.gateway.openapi import openapi_document
from tests.gateway.conftest import bearer

REFUSED = [
    ("/v1/chat/completions", "ChatCompletionRequest", {"model": "offline", "messages": [{"role": "tool"}]}),
    ("/v1/chat/completions", "ChatCompletionRequest",
     {"model": "offline", "messages": [{"role": "tool", "tool_call_id": "call_1", "content": "42"}]}),
    ("/v1/responses", "ResponsesRequest", {"model": "offline", "input": None}),
    ("/v1/responses", "ResponsesRequest", {"model": "offline"}),
    ("/v1/responses", "ResponsesRequest", {"model": "offline", "input": []}),
]
ACCEPTED = [
    ("/v1/chat/completions", "ChatCompletionRequest", {"model": "offline", "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/responses", "ResponsesRequest", {"model": "offline", "input": "hi"}),
    ("/v1/responses", "ResponsesRequest", {"model": "offline", "instructions": "Say hi."}),
]


def document_accepts(schema_name: str, body: dict[str, Any]) -> bool:
    document = openapi_document(["offline"])
    return Draft202012Validator({**document, "$ref": f"#/components/schemas/{schema_name}"}).is_valid(body)


@pytest.mark.parametrize(("path", "schema", "body"), REFUSED)
async def test_a_body_the_server_refuses_the_document_refuses(gateway, path, schema, body):
    async with httpx.AsyncClient(base_url=gateway.url, headers=bearer(), timeout=20) as http:
        answer = await http.post(path, json=body)
    assert answer.status_code == 400, answer.text
    assert not document_accepts(schema, body)


@pytest.mark.parametrize(("path", "schema", "body"), ACCEPTED)
async def test_a_body_the_server_answers_the_document_accepts(gateway, path, schema, body):
    async with httpx.AsyncClient(base_url=gateway.url, headers=bearer(), timeout=20) as http:
        answer = await http.post(path, json=body)
    assert answer.status_code == 200, answer.text
    assert document_accepts(schema, body)


async def test_options_on_a_stored_response_names_get_and_delete(gateway):
    async with httpx.AsyncClient(base_url=gateway.url, headers=bearer(), timeout=20) as http:
        answer = await http.options("/v1/responses/resp_123")
    assert answer.status_code == 405
    assert {m.strip() for m in answer.headers["allow"].split(",")} >= {"GET", "HEAD", "DELETE"}
