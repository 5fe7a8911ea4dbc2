"""Stored Responses API responses: each one a JSON value in Redis with a TTL, under a key
that names its owner (the caller's principal), so that nobody else can read, continue
from or delete it: to another principal the response does not exist.

A stored response holds the Response object (what `GET /v1/responses/{id}` returns) and
the conversation through it in Chat Completions form (what `previous_response_id`
continues from). `instructions` are not part of the conversation: like OpenAI's, they hold
for one response only.
"""

from __future__ import annotations

import hashlib
from typing import Any

import redis.asyncio as aredis
from pydantic import BaseModel, Field

from hookbus.bus.keys import Keys
from hookbus.skills import AuthInfo

STORED_RESPONSE_TTL = 30 * 24 * 3600  # OpenAI keeps stored responses for 30 days


class StoredResponse(BaseModel):
    response: dict[str, Any] = Field(description="The Response object as the client got it.")
    messages: list[dict[str, Any]] = Field(
        description="The conversation through this response (chat messages, no instructions)."
    )


def owner_of(auth: AuthInfo) -> str:
    """The principal's key part: a digest of its peer user id (with auth off, or a key
    without a peer, every caller is the same principal)."""
    return hashlib.sha256((auth.peer_user_id or "").encode()).hexdigest()[:32]


class StoredResponses:
    def __init__(self, client: aredis.Redis, keys: Keys, ttl: int = STORED_RESPONSE_TTL) -> None:
        self._client = client
        self._keys = keys
        self.ttl = ttl

    async def save(self, auth: AuthInfo, response_id: str, stored: StoredResponse) -> None:
        key = self._keys.stored_response(owner_of(auth), response_id)
        await self._client.set(key, stored.model_dump_json(), ex=self.ttl)

    async def load(self, auth: AuthInfo, response_id: str) -> StoredResponse | None:
        raw = await self._client.get(self._keys.stored_response(owner_of(auth), response_id))
        return StoredResponse.model_validate_json(raw) if raw else None

    async def delete(self, auth: AuthInfo, response_id: str) -> bool:
        return bool(await self._client.delete(self._keys.stored_response(owner_of(auth), response_id)))
