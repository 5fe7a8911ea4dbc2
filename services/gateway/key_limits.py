"""Per-key limits, as LiteLLM's virtual keys have them: requests in flight and per minute.

In the API keys file:

    {"sk-...": {"peer_user_id": "alice", "max_parallel_requests": 4, "rpm_limit": 60}}

Beyond either, a model request (any POST under `/v1/`) gets a 429 `rate_limit_exceeded`
with `Retry-After` (seconds). The counts live in Redis, so every gateway of a deployment
shares them; one Lua script checks and records both in one round trip, on Redis's clock:

- in flight: a sorted set of request ids scored by when their lease ends (the gateway's
  request timeout); a request removes itself as its response's last bytes go out, and one whose
  gateway died is forgotten when its lease runs out;
- per minute: a sorted set of the last 60 s of admitted request ids scored by start time
  (a sliding window; a refused request does not count). Retry-After says when the oldest
  leaves the window.

The keys hold a hash of the API key, never the key.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import uuid

import redis.asyncio as aredis
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hookbus.bus.connection.retrying import RECONNECT_ERRORS
from hookbus.bus.keys import Keys
from hookbus.services.gateway.auth import Authenticator
from hookbus.services.gateway.errors import GatewayError, error_response

WINDOW_MS = 60_000

_ADMIT = """
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local parallel, rpm, lease = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if parallel > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZCARD', KEYS[1]) >= parallel then
    return {0, 'parallel', 1000}
  end
end
if rpm > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[5]))
  if redis.call('ZCARD', KEYS[2]) >= rpm then
    local oldest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    return {0, 'rpm', tonumber(oldest[2]) + tonumber(ARGV[5]) - now}
  end
  redis.call('ZADD', KEYS[2], now, ARGV[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
end
if parallel > 0 then
  redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], lease)
end
return {1, '', 0}
"""


class _Slot:
    """One admitted request's place among its key's requests in flight.

    Given back before the response's last byte leaves, not after: a client that sends its
    next request the moment the previous one ended must find the slot free."""

    def __init__(self, redis: aredis.Redis, parallel: str, request_id: str) -> None:
        self._redis, self._parallel, self._request_id = redis, parallel, request_id
        self._held = True

    async def give_back(self) -> None:
        if self._held:
            self._held = False
            with contextlib.suppress(*RECONNECT_ERRORS):  # else its lease ends it
                await self._redis.zrem(self._parallel, self._request_id)


def key_id(api_key: str) -> str:
    """What names a key in Redis: a hash, so that reading Redis does not reveal keys."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:24]


class KeyLimits:
    """ASGI middleware: admits a model request within its key's limits, or answers 429."""

    def __init__(
        self, app: ASGIApp, *, authenticator: Authenticator, redis: aredis.Redis, keys: Keys, lease_seconds: float
    ) -> None:
        self.app = app
        self._authenticator = authenticator
        self._redis = redis
        self._keys = keys
        self._lease_ms = int(lease_seconds * 1000)
        self._admit = redis.register_script(_ADMIT)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        found = self._authenticator.lookup(Headers(scope=scope))
        if found is None or not (found[1].max_parallel_requests or found[1].rpm_limit):
            await self.app(scope, receive, send)  # no limits, or no key: the route answers 401
            return
        token, limits = found
        parallel, minute = self._keys.key_usage(key_id(token))
        request_id = uuid.uuid4().hex
        try:
            admitted, which, retry_ms = await self._admit(
                keys=[parallel, minute],
                args=[request_id, limits.max_parallel_requests or 0, limits.rpm_limit or 0, self._lease_ms, WINDOW_MS],
            )
        except RECONNECT_ERRORS as exc:
            refusal = GatewayError(503, "bus_unavailable", f"the request queue is unreachable: {exc}")
            await error_response(refusal, Request(scope))(scope, receive, send)
            return
        if not admitted:
            await self._too_many(scope, receive, send, which, int(retry_ms))
            return
        if not limits.max_parallel_requests:
            await self.app(scope, receive, send)
            return
        slot = _Slot(self._redis, parallel, request_id)

        async def send_then_free(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                await slot.give_back()  # before the caller can see the end and send its next request
            await send(message)

        try:
            await self.app(scope, receive, send_then_free)
        finally:
            await slot.give_back()

    async def _too_many(self, scope: Scope, receive: Receive, send: Send, which: bytes, retry_ms: int) -> None:
        what = "requests in flight" if which == b"parallel" else "requests per minute"
        seconds = max(1, math.ceil(retry_ms / 1000))
        refusal = GatewayError(
            429, "rate_limit_exceeded", f"this API key is at its limit of {what}; retry in {seconds} s"
        )
        response = error_response(refusal, Request(scope))
        response.headers["Retry-After"] = str(seconds)
        await response(scope, receive, send)
