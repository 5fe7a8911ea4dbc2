"""API keys: `Authorization: Bearer <key>` -> `ctx.auth` (`peer_user_id`, `scopes`).

Keys come from a JSON file (`hookbus gateway --api-keys FILE`) or, without one, from the
`HOOKBUS_API_KEYS` environment variable holding the same JSON:

    {"sk-alice-123": {"peer_user_id": "alice", "scopes": ["paid"]},
     "sk-bob-456":   {"peer_user_id": "bob"}}

With neither, auth is off: every request is served with an empty `ctx.auth` (no peer, no
scopes) and the gateway logs a warning at start. `/healthz` and `/metrics` never need a
key (probes and scrapers); everything under `/v1/` does when auth is on.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from starlette.requests import Request

from hookbus.services.gateway.errors import GatewayError
from hookbus.skills import AuthInfo

API_KEYS_ENV = "HOOKBUS_API_KEYS"


class ApiKey(BaseModel):
    peer_user_id: str | None = None
    scopes: list[str] = Field(default_factory=list)


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
    if any(not key.strip() for key in keys):
        raise ValueError(f"{source}: an API key is empty")
    return keys


def load_api_keys(path: str | None = None) -> dict[str, ApiKey] | None:
    """Keys from `path`, else from $HOOKBUS_API_KEYS, else None (auth off)."""
    if path:
        return parse_api_keys(Path(path).read_bytes(), path)
    raw = os.environ.get(API_KEYS_ENV, "").strip()
    if raw:
        return parse_api_keys(raw, f"${API_KEYS_ENV}")
    return None


def normalize_keys(api_keys: dict[str, ApiKey | dict] | None) -> dict[str, ApiKey] | None:
    if api_keys is None:
        return None
    return {key: ApiKey.model_validate(value) for key, value in api_keys.items()}


class Authenticator:
    def __init__(self, api_keys: dict[str, ApiKey] | None) -> None:
        self.enabled = api_keys is not None
        self._keys = [(key.encode(), info) for key, info in (api_keys or {}).items()]

    def __call__(self, request: Request) -> AuthInfo:
        """The caller's AuthInfo; raises a 401 GatewayError for a missing or unknown key."""
        if not self.enabled:
            return AuthInfo()
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise GatewayError(
                401, "missing_api_key",
                "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
            )
        found: ApiKey | None = None
        presented = token.encode()
        for key, info in self._keys:  # compare with every key, in constant time per key
            if hmac.compare_digest(key, presented):
                found = info
        if found is None:
            raise GatewayError(401, "invalid_api_key", "Incorrect API key provided.")
        return AuthInfo(peer_user_id=found.peer_user_id, scopes=list(found.scopes))

