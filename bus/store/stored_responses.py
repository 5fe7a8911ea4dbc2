"""Stored Responses API responses: each one a JSON value in Redis with a TTL, under a key
that names its owner (the caller's principal), so that nobody else can read, continue
from or delete it: to another principal the response does not exist.

A stored response holds the Response object (what `GET /v1/responses/{id}` returns) and
the conversation before its answer in Chat Completions form; the answer is kept once, in
the Response object (`previous_response_id` continues from the conversation plus that
answer). `instructions` are not part of the conversation: like OpenAI's, they hold for one
response only.

Each principal's stored responses are counted in bytes (`stored-bytes:{owner}`, a hash of
each response's size and expiry; expired ones drop out when counted): a principal at its
quota (`max_stored_bytes` in the keys file, MAX_STORED_BYTES by default) is refused new
stored responses until some expire or are deleted. The quota is checked before the run,
so a principal may go over it by its last response at most.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import redis.asyncio as aredis
from pydantic import BaseModel, Field

from hookbus.bus.keys import Keys
from hookbus.skills import AuthInfo

STORED_RESPONSE_TTL = 30 * 24 * 3600  # OpenAI keeps stored responses for 30 days
MAX_STORED_BYTES = 100 * 1024 * 1024
"""Bytes of stored responses one principal may hold, unless its key says otherwise."""

_USED = """
local now, total, fields = tonumber(ARGV[1]), 0, redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local size, expires = string.match(fields[i + 1], '^(%d+):(%d+)$')
  if size == nil or tonumber(expires) <= now then
    redis.call('HDEL', KEYS[1], fields[i])
  else
    total = total + tonumber(size)
  end
end
return total
"""


class StoredResponse(BaseModel):
    response: dict[str, Any] = Field(description="The Response object as the client got it.")
    messages: list[dict[str, Any]] = Field(
        description="The conversation (chat messages, no instructions): before this response's "
        "answer when `answer_apart`, through it in records stored before that field."
    )
    answer_apart: bool = Field(
        default=False, description="The answer is only in `response` (not repeated in `messages`)."
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
        self._used = client.register_script(_USED)

    async def save(self, auth: AuthInfo, response_id: str, stored: StoredResponse) -> None:
        owner = owner_of(auth)
        value = stored.model_dump_json()
        sizes = self._keys.stored_bytes(owner)
        # two keys of different slots on a cluster: one pipeline, not one script
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.set(self._keys.stored_response(owner, response_id), value, ex=self.ttl)
            pipe.hset(sizes, response_id, f"{len(value)}:{int(time.time()) + self.ttl}")
            pipe.expire(sizes, self.ttl)
            await pipe.execute()

    async def used(self, auth: AuthInfo) -> int:
        """Bytes of the principal's stored responses that have not expired."""
        return int(await self._used(keys=[self._keys.stored_bytes(owner_of(auth))], args=[int(time.time())]))

    async def load(self, auth: AuthInfo, response_id: str) -> StoredResponse | None:
        raw = await self._client.get(self._keys.stored_response(owner_of(auth), response_id))
        return StoredResponse.model_validate_json(raw) if raw else None

    async def delete(self, auth: AuthInfo, response_id: str) -> bool:
        owner = owner_of(auth)
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.delete(self._keys.stored_response(owner, response_id))
            pipe.hdel(self._keys.stored_bytes(owner), response_id)
            deleted, _ = await pipe.execute()
        return bool(deleted)
