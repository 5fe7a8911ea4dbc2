"""One real stack for the gateway tests of a module: embedded Redis, an orchestrator and two
worker groups in-process, and a real uvicorn gateway on a loopback port in front of them.

Worker skills (scopes come from the API keys below):
- group `billing`: `Billing` raises a 402 in on_connection for scope `metered`; `Ledger`
  counts finalize_connection runs (and the error status) in the session's data;
- group `tools`: `Notes` has a `remember` tool writing to the session; `Tripwire` raises a
  503 at the fourth chunk for scope `trip` (an error after streaming started).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from hookbus import Agent
from hookbus.bus.keys import Keys
from hookbus.bus.limits import RequestLimits
from hookbus.bus.store.sessions import SessionStore
from hookbus.skills import Context, HookData, HookError, PaymentRequired, Skill, hook
from tests.gateway.server import RunningGateway, running_gateway
from tests.integration.stack import Notes, running_stack

KEY = "sk-test-alice"
BROKE_KEY = "sk-test-bob"
TRIP_KEY = "sk-test-carol"
API_KEYS: dict[str, Any] = {
    KEY: {"peer_user_id": "alice", "scopes": []},
    BROKE_KEY: {"peer_user_id": "bob", "scopes": ["metered"]},
    TRIP_KEY: {"peer_user_id": "carol", "scopes": ["trip"]},
}
MAX_BODY = 64 * 1024


def bearer(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class Billing(Skill):
    name = "billing"

    @hook("on_connection", 1, scope="metered")
    async def charge(self, data: HookData, ctx: Context) -> HookData:
        raise PaymentRequired("no credit left", {"balance": 0})


class Ledger(Skill):
    name = "ledger"

    @hook("finalize_connection")
    async def count(self, data: HookData, ctx: Context) -> HookData:
        if ctx.session.id:
            ctx.session.data["finalized"] = ctx.session.data.get("finalized", 0) + 1
            ctx.session.data["error"] = data.error.status_code if data.error else None
            ctx.session.data["peer"] = ctx.auth.peer_user_id
        return data


class Tripwire(Skill):
    name = "tripwire"

    @hook("on_chunk", scope="trip")
    async def trip(self, data: HookData, ctx: Context) -> HookData:
        if data.chunk_index == 3:
            raise HookError(503, "tripped", "tripped after streaming started")
        return data


@pytest.fixture(scope="module")
def module_prefix() -> str:
    return f"gw{uuid.uuid4().hex[:8]}:"


@pytest.fixture(scope="module")
async def stack(redis_url: str, module_prefix: str) -> AsyncIterator[Any]:
    groups = {"billing": [Billing(), Ledger()], "tools": [Notes(), Tripwire()]}
    async with running_stack(redis_url, module_prefix, Agent("gateway-test"), groups) as running:
        yield running


@pytest.fixture(scope="module")
async def gateway(stack: Any, redis_url: str, module_prefix: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(
        redis_url, module_prefix, api_keys=API_KEYS, models=["offline"], limits=RequestLimits(max_request_bytes=MAX_BODY)
    ) as gw:
        yield gw


@pytest.fixture
def sessions(stack: Any, module_prefix: str) -> SessionStore:
    client = stack[0]
    return SessionStore(client.redis, Keys(module_prefix))

