"""Attacks on the gateway's edge, each performed over HTTP against a real gateway:
cross-site shapes and DNS rebinding against an auth-off gateway, unbounded metric labels,
anonymous health details, per-key limits shared by several gateways, and error texts that
name tools the caller may not see."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from hookbus import Agent
from hookbus.services.gateway.key_limits import key_id
from hookbus.skills import Context, HookData, Skill, hook, tool
from tests.gateway.conftest import bearer
from tests.gateway.server import RunningGateway, running_gateway
from tests.gateway.test_http import CHAT, assert_openai_error
from tests.integration.stack import running_stack
from tests.waiting import wait_for

BODY = {"model": "offline", "messages": [{"role": "user", "content": "[[echo]] hello"}]}


@pytest.fixture(scope="module")
async def open_gateway(stack: Any, redis_url: str, module_prefix: str) -> AsyncIterator[RunningGateway]:
    """An auth-off gateway in front of the module's stack, answering one extra Host name."""
    async with running_gateway(
        redis_url, module_prefix, models=["offline"], allowed_hosts=["gateway.internal"]
    ) as gw:
        yield gw


@pytest.fixture
async def http(open_gateway: RunningGateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=open_gateway.url, timeout=30) as client:
        yield client


# ------------------------------------------------------------- cross-site shapes


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None],
)
async def test_an_auth_off_gateway_refuses_bodies_a_browser_sends_cross_site(http, content_type):
    import json

    headers = {"content-type": content_type} if content_type else {}
    response = await http.post(CHAT, content=json.dumps(BODY).encode(), headers=headers)
    assert_openai_error(response, 415, "unsupported_media_type")


async def test_an_auth_off_gateway_takes_json_bodies(http):
    response = await http.post(CHAT, json=BODY, headers={"content-type": "application/json; charset=utf-8"})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "hello"


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.nip.io", "[::ffff:7f00:1]x"])
async def test_an_auth_off_gateway_refuses_a_rebound_host_name(http, host):
    response = await http.post(CHAT, json=BODY, headers={"host": host})
    error = assert_openai_error(response, 403, "host_not_allowed")
    assert "--allowed-hosts" in error["message"]
    assert_openai_error(await http.get("/v1/models", headers={"host": host}), 403, "host_not_allowed")
    assert (await http.get("/healthz", headers={"host": host})).status_code in (200, 503)  # probes use pod IPs


@pytest.mark.parametrize("host", ["localhost:8000", "127.0.0.1", "[::1]:8000", "app.localhost", "gateway.internal:80"])
async def test_an_auth_off_gateway_answers_loopback_and_configured_host_names(http, host):
    response = await http.post(CHAT, json=BODY, headers={"host": host})
    assert response.status_code == 200, response.text


# ----------------------------------------------------------------- metrics labels


async def test_an_arbitrary_http_method_does_not_become_a_metric_label(http):
    """A made-up method stops at the HTTP parser (llhttp knows the registered ones); one it
    knows that no route serves (PROPFIND) reaches the app and is counted as `other`."""
    method = f"X{uuid.uuid4().hex.upper()}"
    assert (await http.request(method, "/v1/models")).status_code == 400
    assert (await http.request("PROPFIND", "/v1/models")).status_code in (404, 405)
    text = (await http.get("/metrics")).text
    assert method not in text and "PROPFIND" not in text
    assert 'method="other"' in text


# ------------------------------------------------------------------ health detail


async def test_healthz_tells_an_anonymous_caller_only_up_or_down(gateway):
    async with httpx.AsyncClient(base_url=gateway.url) as anonymous:
        plain = await anonymous.get("/healthz")
        wrong = await anonymous.get("/healthz", headers={"Authorization": "Bearer sk-not-a-key"})
        keyed = await anonymous.get("/healthz", headers=bearer())
    assert plain.json() == {"status": "ok"} and wrong.json() == {"status": "ok"}
    assert keyed.json()["orchestrators"] and keyed.json()["worker_groups"]


# ------------------------------------------------------------------ per-key limits


LIMITED = f"sk-limited-{uuid.uuid4().hex}"
PER_MINUTE = f"sk-perminute-{uuid.uuid4().hex}"
COUNTED = f"sk-counted-{uuid.uuid4().hex}"
"""A key of its own for the test that looks for usage records, so it needs no other test's."""
LIMITED_KEYS = {
    LIMITED: {"peer_user_id": "lim", "max_parallel_requests": 1},
    PER_MINUTE: {"peer_user_id": "rpm", "rpm_limit": 3},
    COUNTED: {"peer_user_id": "counted", "rpm_limit": 1000},
}


@pytest.fixture(scope="module")
async def two_gateways(stack: Any, redis_url: str, module_prefix: str) -> AsyncIterator[list[RunningGateway]]:
    async with (
        running_gateway(redis_url, module_prefix, api_keys=LIMITED_KEYS, models=["offline"]) as one,
        running_gateway(redis_url, module_prefix, api_keys=LIMITED_KEYS, models=["offline"]) as two,
    ):
        yield [one, two]


async def test_max_parallel_requests_holds_across_gateways_with_429_and_retry_after(two_gateways, stack):
    one, two = two_gateways
    client = stack[0]
    in_flight, _ = client.keys.key_usage(key_id(LIMITED))
    slow = {"model": "offline", "messages": [{"role": "user", "content": "[[delay:2000]] slow"}]}
    async with httpx.AsyncClient(timeout=30) as http:
        first = asyncio.create_task(http.post(one.v1 + "/chat/completions", json=slow, headers=bearer(LIMITED)))

        async def first_holds_its_slot() -> bool:
            return await client.redis.zcard(in_flight) == 1

        assert await wait_for(first_holds_its_slot, timeout=10)
        started = time.perf_counter()
        second = await http.post(two.v1 + "/chat/completions", json=BODY, headers=bearer(LIMITED))
        refused_in = time.perf_counter() - started
        error = assert_openai_error(second, 429, "rate_limit_exceeded")
        assert error["type"] == "rate_limit_error" and "in flight" in error["message"]
        assert second.headers["retry-after"] == "1"
        assert refused_in < 1.5
        assert (await first).status_code == 200
        after = await http.post(two.v1 + "/chat/completions", json=BODY, headers=bearer(LIMITED))
        assert after.status_code == 200, after.text  # the slot was given back when the first ended

        async def all_slots_given_back() -> bool:
            return await client.redis.zcard(in_flight) == 0

        assert await wait_for(all_slots_given_back, timeout=10)


async def test_rpm_limit_refuses_the_request_over_it_with_retry_after(two_gateways):
    one, two = two_gateways
    async with httpx.AsyncClient(timeout=30) as http:
        statuses = []
        for gateway in (one, two, one, two):
            response = await http.post(gateway.v1 + "/chat/completions", json=BODY, headers=bearer(PER_MINUTE))
            statuses.append(response.status_code)
    assert statuses == [200, 200, 200, 429], statuses
    error = assert_openai_error(response, 429, "rate_limit_exceeded")
    assert "per minute" in error["message"]
    assert 1 <= int(response.headers["retry-after"]) <= 60


async def test_keys_without_limits_and_unknown_keys_are_not_counted(two_gateways, stack):
    one, _ = two_gateways
    async with httpx.AsyncClient(timeout=30) as http:
        unknown = await http.post(one.v1 + "/chat/completions", json=BODY, headers=bearer("sk-nobody-0123456789"))
        counted = await http.post(one.v1 + "/chat/completions", json=BODY, headers=bearer(COUNTED))
    assert_openai_error(unknown, 401, "invalid_api_key")
    assert counted.status_code == 200, counted.text
    client = stack[0]
    usage = [k async for k in client.redis.scan_iter(match=f"{client.keys.prefix}key-usage:*")]
    assert usage, "the limited keys' usage is kept in Redis"
    secrets = (LIMITED, PER_MINUTE, COUNTED)
    assert not any(key.encode() in k for key in secrets for k in usage)  # hashed, never the key


# -------------------------------------------------------------- error texts


class ToolsWithASecret(Skill):
    """A public tool, an admin-only one, and a hook that sends every call to a tool that does
    not exist, so that the model gets the "unknown tool" error listing the tools."""

    name = "tools-with-a-secret"

    @tool
    def public_echo(self, text: str) -> str:
        """Echo the text."""
        return text

    @tool(scope="admin")
    def hidden_audit(self) -> str:
        """Admin only."""
        return "audit"

    @hook("before_toolcall")
    def misroute(self, data: HookData, ctx: Context) -> HookData:
        assert data.tool_call is not None
        data.tool_call["function"]["name"] = "no_such_tool"
        return data


async def test_an_error_text_names_only_the_tools_the_caller_may_see(redis_url, prefix):
    plain, admin = f"sk-plain-{uuid.uuid4().hex}", f"sk-admin-{uuid.uuid4().hex}"
    keys = {plain: {"peer_user_id": "p", "scopes": []}, admin: {"peer_user_id": "a", "scopes": ["admin"]}}
    agent = Agent("secrets", skills=[ToolsWithASecret()])
    call = {"model": "offline", "messages": [{"role": "user", "content": '[[tool:public_echo {"text": "x"}]]'}]}
    async with (
        running_stack(redis_url, prefix, agent),
        running_gateway(redis_url, prefix, api_keys=keys, models=["offline"]) as gw,
        httpx.AsyncClient(base_url=gw.v1, timeout=30) as http,
    ):
        seen_by_plain = (await http.post("/chat/completions", json=call, headers=bearer(plain))).json()
        seen_by_admin = (await http.post("/chat/completions", json=call, headers=bearer(admin))).json()
    plain_text = seen_by_plain["choices"][0]["message"]["content"]
    admin_text = seen_by_admin["choices"][0]["message"]["content"]
    assert "unknown tool 'no_such_tool'; available tools: public_echo" in plain_text, plain_text
    assert "hidden_audit" not in plain_text
    assert "hidden_audit" in admin_text  # the listing is per caller, not just shorter
