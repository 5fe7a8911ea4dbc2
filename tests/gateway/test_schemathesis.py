"""Property-based requests from the gateway's own OpenAPI document: no 5xx, ever.

Cases run against the live gateway (and so through the real queue, orchestrator and worker
groups); the generated calls are blocking `requests` calls, so they run in a thread while
this test's event loop keeps the in-process orchestrator going.
"""

from __future__ import annotations

import asyncio

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from tests.gateway.conftest import bearer

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"


def run_cases(url: str, schema: schemathesis.BaseSchema, mode: GenerationMode, checks: list, examples: int) -> int:
    strategy = schema.as_strategy(mode, headers=bearer())
    calls = 0

    @given(case=strategy)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def check(case: schemathesis.Case) -> None:
        nonlocal calls
        response = case.call(base_url=url, timeout=30)
        calls += 1
        case.validate_response(response, checks=checks)

    check()
    return calls


async def test_generated_requests_never_get_a_server_error(gateway):
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        document = (await http.get("/openapi.json")).json()
    schema = schemathesis.openapi.from_dict(document)
    chat, responses = schema.include(path=CHAT), schema.include(path=RESPONSES)
    others = schema.exclude(path=CHAT).exclude(path=RESPONSES)
    conformance = [not_a_server_error, status_code_conformance, response_schema_conformance]
    calls = 0
    for create, examples in ((chat, 40), (responses, 25)):
        calls += await asyncio.to_thread(run_cases, gateway.url, create, GenerationMode.POSITIVE, conformance, examples)
        # invalid bodies, types and headers: always a 4xx, never a 5xx
        calls += await asyncio.to_thread(
            run_cases, gateway.url, create, GenerationMode.NEGATIVE, [not_a_server_error], examples
        )
    # the GET operations have (almost) nothing to make invalid: positive only
    calls += await asyncio.to_thread(run_cases, gateway.url, others, GenerationMode.POSITIVE, conformance, 15)
    assert calls >= 130
