"""Per-conversation session data (`ctx.session.data`), one JSON value per session in Redis."""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aredis

from hookbus.bus.keys import Keys

SESSION_TTL = 30 * 24 * 3600


class SessionStore:
    def __init__(self, client: aredis.Redis, keys: Keys, ttl: int = SESSION_TTL) -> None:
        self._client = client
        self._keys = keys
        self._ttl = ttl

    async def load(self, session_id: str) -> dict[str, Any]:
        raw = await self._client.get(self._keys.session(session_id))
        if not raw:
            return {}
        value = json.loads(raw)
        return value if isinstance(value, dict) else {}

    async def save(self, session_id: str, data: dict[str, Any]) -> None:
        await self._client.set(
            self._keys.session(session_id), json.dumps(data, default=str), ex=self._ttl
        )
