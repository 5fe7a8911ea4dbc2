"""Stored Responses have a quota per principal (`max_stored_bytes` in the keys file): at
it, a request that would store is refused with a 429 that says so (one with `store: false`
is not), and deleting frees room. A stored response keeps its answer once."""

from __future__ import annotations

import uuid

import httpx
import redis.asyncio as aredis

from hookbus import Agent
from hookbus.bus.store.stored_responses import owner_of
from hookbus.skills import AuthInfo
from tests.gateway.server import running_gateway
from tests.integration.stack import running_stack

KEY = "sk-quota"
TEXT = "q" * 100_000
"""An input the offline model echoes: 100 kB in, 100 kB out."""
QUOTA = 300_000


async def test_a_principal_at_its_stored_bytes_quota_is_refused_until_it_deletes(redis_url):
    prefix = f"quota{uuid.uuid4().hex[:6]}:"
    keys_file = {KEY: {"peer_user_id": "hoarder", "max_stored_bytes": QUOTA}}
    async with (
        running_stack(redis_url, prefix, Agent("quota")) as (client, _, _),
        running_gateway(redis_url, prefix, api_keys=keys_file, models=["offline"]) as gw,
        httpx.AsyncClient(base_url=gw.v1, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as http,
    ):

        async def respond(**extra: object) -> httpx.Response:
            return await http.post("/responses", json={"model": "offline", "input": f"[[echo]] {TEXT}", **extra})

        first, second, third = await respond(), await respond(), await respond()
        unstored = await respond(store=False)
        redis = aredis.Redis.from_url(redis_url)
        owner = owner_of(AuthInfo(peer_user_id="hoarder"))
        stored_size = await redis.strlen(client.keys.stored_response(owner, first.json()["id"]))
        await redis.aclose()
        continued = await respond(previous_response_id=second.json()["id"], store=False)
        assert (await http.delete(f"/responses/{first.json()['id']}")).status_code == 200
        after_delete = await respond()
    assert first.status_code == second.status_code == 200
    assert third.status_code == 429, third.text  # 2 x ~200 kB stored: at the 300 kB quota
    error = third.json()["error"]
    assert error["code"] == "stored_responses_quota_exceeded" and "max_stored_bytes" in error["message"]
    assert unstored.status_code == 200  # nothing to store: not refused
    assert stored_size < 2.2 * len(TEXT), stored_size  # the input and the answer, each once
    assert continued.status_code == 200, continued.text  # the conversation still has the answer
    assert after_delete.status_code == 200, after_delete.text
    print(f"stored responses: {stored_size:,} bytes stored for {len(TEXT):,} bytes in and out")
