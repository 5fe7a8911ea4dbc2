"""Per-conversation session data (`ctx.session.data`), one JSON value per session in Redis.

A session belongs to the principal that sent the request (`ctx.auth.peer_user_id`): the
key is built from the owner and the client's session id together (Keys.session), so a
caller that sends another's session id gets a session of its own, empty.

It also holds the server-side calls and results of a response that returned client tool
calls, for the client's next request (hookbus.services.orchestrator.loop.client_tools).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aredis

from hookbus.bus.keys import Keys

SESSION_TTL = 30 * 24 * 3600
HELD_RESULTS_TTL = 24 * 3600


class SessionStore:
    def __init__(self, client: aredis.Redis, keys: Keys, ttl: int = SESSION_TTL) -> None:
        self._client = client
        self._keys = keys
        self._ttl = ttl

    async def load(self, owner: str | None, session_id: str) -> dict[str, Any]:
        raw = await self._client.get(self._keys.session(owner, session_id))
        if not raw:
            return {}
        value = json.loads(raw)
        return value if isinstance(value, dict) else {}

    async def save(self, owner: str | None, session_id: str, data: dict[str, Any]) -> None:
        """Store the data (its TTL starts again); empty data leaves no key behind, so a
        request whose skills store nothing writes nothing."""
        key = self._keys.session(owner, session_id)
        if not data:
            await self._client.delete(key)
            return
        await self._client.set(key, json.dumps(data, default=str), ex=self._ttl)

    async def hold_tool_results(self, key: str, record: dict[str, Any]) -> None:
        await self._client.set(
            self._keys.held_tool_results(key), json.dumps(record, default=str), ex=HELD_RESULTS_TTL
        )

    async def held_tool_results(self, keys: Sequence[str]) -> list[dict[str, Any] | None]:
        if not keys:
            return []
        async with self._client.pipeline(transaction=False) as pipe:  # keys may span slots
            for key in keys:
                pipe.get(self._keys.held_tool_results(key))
            values = await pipe.execute()
        return [json.loads(raw) if raw else None for raw in values]
