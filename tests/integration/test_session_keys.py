"""Session keys: one per principal and id, and none at all until a skill stores something."""

from __future__ import annotations

import uuid

from hookbus import Agent
from hookbus.bus.keys import Keys
from hookbus.skills import Context, HookData, Skill, hook
from tests.integration.stack import running_stack


class Counter(Skill):
    name = "counter"

    @hook("on_connection")
    async def count(self, data: HookData, ctx: Context) -> None:
        if ctx.metadata.get("count"):
            ctx.session.data["count"] = ctx.session.data.get("count", 0) + 1


def test_an_owner_with_a_colon_cannot_spell_another_owners_key() -> None:
    keys = Keys("p:")
    assert keys.session("a:b", "c") != keys.session("a", "b:c")
    assert keys.session(None, "x") != keys.session("@anonymous", "x")


async def test_no_session_key_is_written_until_a_skill_stores_something(redis_url, prefix) -> None:
    sid = f"s-{uuid.uuid4().hex[:8]}"
    key = Keys(prefix).session("alice", sid)
    async with running_stack(redis_url, prefix, Agent("s"), {"g": [Counter()]}) as (client, _, _):
        await client.complete("hi", session_id=sid, auth={"peer_user_id": "alice"})
        assert not await client.redis.exists(key)
        await client.complete("hi", session_id=sid, auth={"peer_user_id": "alice"}, metadata={"count": 1})
        assert await client.redis.get(key) == b'{"count": 1}'
        assert await client.redis.ttl(key) > 0
