"""API keys: `Authorization: Bearer <key>` -> `ctx.auth` (`peer_user_id`, `scopes`).

Keys come from a JSON file (`hookbus gateway --api-keys FILE`) or, without one, from the
`HOOKBUS_API_KEYS` environment variable holding the same JSON:

    {"sk-3Jq...": {"peer_user_id": "alice", "scopes": ["paid"]},
     "sk-x9W...": {"peer_user_id": "bob", "max_parallel_requests": 2, "rpm_limit": 60},
     "sk-b7K...": {"peer_user_id": "carol", "agents": ["billing"]}}

A key with `agents` may call only those agents (hookbus.services.gateway.agent_routes);
any other is a 403 that does not say whether the agent exists.

Configuration fails closed: an empty `--api-keys ""` or a set but empty
`HOOKBUS_API_KEYS`, a file with no keys, a key without `peer_user_id` (callers would
share one memory owner), a key shorter than 16 characters or one of the placeholders of
the examples (`change-me-...`, `sk-alice`, ...) are refused with an error before the
gateway starts. Only when neither is given at all is auth off: every request is served
with an empty `ctx.auth`, and the gateway says so on stderr at start.

With auth on, everything under `/v1/` needs a key; `/healthz` answers up/down to anyone
and its details to a caller with a key; `/metrics` needs none (scrapers).
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from starlette.datastructures import Headers
from starlette.requests import Request

from hookbus.services.gateway.errors import GatewayError
from hookbus.skills import AuthInfo

API_KEYS_ENV = "HOOKBUS_API_KEYS"
MIN_KEY_LENGTH = 16
PLACEHOLDER_KEYS = frozenset({"sk-alice", "sk-bob", "dev-key", "sk-...", "your-api-key", "sk-your-key"})
PLACEHOLDER_MARKS = ("change-me", "changeme", "replace-me", "placeholder", "example", "xxxx")
GENERATE = "generate one with: python -c \"import secrets; print('sk-' + secrets.token_urlsafe(32))\""


class ApiKey(BaseModel):
    peer_user_id: str = Field(min_length=1, description="Whose sessions and memory the key's requests use.")
    scopes: list[str] = Field(default_factory=list)
    max_parallel_requests: int | None = Field(default=None, gt=0, description="Requests in flight at most.")
    rpm_limit: int | None = Field(default=None, gt=0, description="Requests per minute at most.")
    max_stored_bytes: int | None = Field(
        default=None, gt=0,
        description="Bytes of stored Responses API responses the key's principal may hold "
        "(default: hookbus.bus.store.stored_responses.MAX_STORED_BYTES).",
    )
    agents: list[str] | None = Field(
        default=None, description="The agents the key may call (by name); absent: every agent."
    )


_KEYS = TypeAdapter(dict[str, ApiKey])


def parse_api_keys(raw: str | bytes, source: str) -> dict[str, ApiKey]:
    """Validate the keys JSON; a ValueError names the source and what is wrong."""
    try:
        keys = _KEYS.validate_json(raw)
    except ValidationError as exc:
        raise ValueError(
            f"{source}: expected JSON {{\"<key>\": {{\"peer_user_id\": \"...\", \"scopes\": [...]}}}}: {exc}"
        ) from exc
    if not keys:
        raise ValueError(f"{source}: no API keys in it (leave it out to run without auth)")
    for key, info in keys.items():
        problem = key_problem(key)
        if problem:
            raise ValueError(f"{source}: the key of {info.peer_user_id!r} {problem}; {GENERATE}")
    return keys


def key_problem(key: str) -> str | None:
    """Why a key must not be used, or None."""
    if not key.strip():
        return "is empty"
    lowered = key.lower()
    if lowered in PLACEHOLDER_KEYS or any(mark in lowered for mark in PLACEHOLDER_MARKS):
        return "is a placeholder from an example"
    if len(key) < MIN_KEY_LENGTH:
        return f"is shorter than {MIN_KEY_LENGTH} characters"
    return None


def load_api_keys(path: str | None = None) -> dict[str, ApiKey] | None:
    """Keys from `path`, else from $HOOKBUS_API_KEYS, else None (auth off).

    `path=""` or a set but empty $HOOKBUS_API_KEYS is a ValueError, not auth off."""
    if path is not None:
        if not path.strip():
            raise ValueError("--api-keys is empty: name a keys file (leave the option out to run without auth)")
        return parse_api_keys(Path(path).read_bytes(), path)
    raw = os.environ.get(API_KEYS_ENV)
    if raw is None:
        return None
    if not raw.strip():
        raise ValueError(f"${API_KEYS_ENV} is set but empty: give it the keys JSON, or unset it to run without auth")
    return parse_api_keys(raw, f"${API_KEYS_ENV}")


def normalize_keys(api_keys: dict[str, ApiKey | dict] | None) -> dict[str, ApiKey] | None:
    if api_keys is None:
        return None
    return {key: ApiKey.model_validate(value) for key, value in api_keys.items()}


class Authenticator:
    def __init__(self, api_keys: dict[str, ApiKey] | None) -> None:
        self.enabled = api_keys is not None
        self._keys = [(key.encode(), key, info) for key, info in (api_keys or {}).items()]

    def lookup(self, headers: Headers) -> tuple[str, ApiKey] | None:
        """The presented key and its entry, or None when none or an unknown one was presented."""
        scheme, _, token = headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        found: tuple[str, ApiKey] | None = None
        presented = token.encode()
        for raw, key, info in self._keys:  # compare with every key, in constant time per key
            if hmac.compare_digest(raw, presented):
                found = (key, info)
        return found

    def __call__(self, request: Request) -> AuthInfo:
        """The caller's AuthInfo; raises a 401 GatewayError for a missing or unknown key.
        The agents the key may call go to `request.state.allowed_agents` (None: all)."""
        request.state.allowed_agents = None
        if not self.enabled:
            return AuthInfo()
        found = self.lookup(request.headers)
        if found is None:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise GatewayError(
                    401, "missing_api_key",
                    "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
                )
            raise GatewayError(401, "invalid_api_key", "Incorrect API key provided.")
        if found[1].agents is not None:
            request.state.allowed_agents = frozenset(found[1].agents)
        return AuthInfo(peer_user_id=found[1].peer_user_id, scopes=list(found[1].scopes))
