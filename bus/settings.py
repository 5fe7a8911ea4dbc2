"""Settings every hookbus process reads from its environment.

One pydantic settings model so that the CLI, the services, the Docker image and the
Kubernetes manifests agree on the names; `hookbus settings` prints them.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

OFFLINE_MODEL = "offline"
"""The model name that asks for the built-in offline stand-in model on purpose
(`HOOKBUS_MODEL=offline`); the orchestrator service needs it or an endpoint to start."""


class Settings(BaseSettings):
    """Process settings; every field maps to the upper-case environment variable of its alias."""

    model_config = SettingsConfigDict(env_prefix="", extra="ignore", populate_by_name=True)

    redis_url: str | None = Field(
        default=None,
        alias="REDIS_URL",
        description="Redis to use; unset means start an embedded Redis server.",
    )
    prefix: str = Field(
        default="hookbus:", alias="HOOKBUS_PREFIX", description="Prefix of every Redis key."
    )
    shards: int | None = Field(
        default=None,
        alias="HOOKBUS_SHARDS",
        description=(
            "Shards of the requests, hook and event streams; the same in every process. "
            "Unset: 1 on a single Redis, 12 on a Redis Cluster."
        ),
    )
    openai_base_url: str | None = Field(
        default=None,
        alias="OPENAI_BASE_URL",
        description=(
            "OpenAI-compatible endpoint. Unset: an Agent used in-process falls back to the "
            "built-in offline model; `hookbus orchestrator` refuses to start unless "
            "HOOKBUS_MODEL=offline."
        ),
    )
    openai_api_key: str | None = Field(default=None, alias="OPENAI_API_KEY")
    model: str | None = Field(default=None, alias="HOOKBUS_MODEL", description="Model name.")
    context_window: int | None = Field(
        default=None,
        alias="HOOKBUS_CONTEXT_WINDOW",
        gt=0,
        description="Context window (tokens) of the model, for one hookbus does not know.",
    )
    llm_timeout: float = Field(
        default=600.0,
        alias="HOOKBUS_LLM_TIMEOUT",
        gt=0,
        description="Seconds one LLM call may take (a long generation is never sent twice).",
    )
    llm_retries: int = Field(
        default=1,
        alias="HOOKBUS_LLM_RETRIES",
        ge=0,
        description="Retries of an LLM call that could not connect; answers (429, 5xx) are never retried.",
    )
    llm_http: Literal["httpx", "aiohttp"] | None = Field(
        default=None,
        alias="HOOKBUS_LLM_HTTP",
        description=(
            "HTTP stack of the openai client: aiohttp or httpx; unset: aiohttp in the "
            "orchestrator service (it closes its clients), httpx for an Agent run in-process."
        ),
    )
    log_format: str = Field(
        default="auto", alias="HOOKBUS_LOG_FORMAT", description="json, console or auto."
    )
    log_level: str = Field(default="info", alias="HOOKBUS_LOG_LEVEL")
    send_on: bool = Field(
        default=True,
        alias="HOOKBUS_SEND_ON",
        description=(
            "Workers send a stage on from one group to the next (hookbus.bus.hops.send_on); "
            "false: the orchestrator sends every hop itself."
        ),
    )
    max_hop_bytes: int = Field(
        default=8 * 1024 * 1024,
        gt=0,
        alias="HOOKBUS_MAX_HOP_BYTES",
        description="Bytes one worker's hop reply may hold (hook data, ctx.state, session); over it the hop fails.",
    )
    max_state_bytes: int = Field(
        default=1024 * 1024,
        gt=0,
        alias="HOOKBUS_MAX_STATE_BYTES",
        description="Bytes of ctx.state (as JSON) a request may carry from hop to hop; over it the hop fails.",
    )
    observe_max_entries: int = Field(
        default=10_000,
        gt=0,
        alias="HOOKBUS_OBSERVE_MAX_ENTRIES",
        description="Entries (requests) an observer group's stream may hold; past it the oldest are dropped, counted.",
    )
    observe_max_bytes: int = Field(
        default=64 * 1024 * 1024,
        gt=0,
        alias="HOOKBUS_OBSERVE_MAX_BYTES",
        description="Bytes of Redis memory an observer group's stream may hold; past it the oldest are dropped, counted.",
    )
    worker_version: str | None = Field(
        default=None,
        alias="HOOKBUS_WORKER_VERSION",
        description=(
            "The version a worker replica runs its group at (e.g. the image tag); `hookbus worker "
            "--version` wins; unset: the skills' declared versions or a hash of their hooks."
        ),
    )
    event_loop: Literal["uvloop", "asyncio"] = Field(
        default="uvloop",
        alias="HOOKBUS_EVENT_LOOP",
        description="Event loop of the orchestrator and the workers: uvloop (where installed) or asyncio.",
    )

    @property
    def served_model(self) -> str:
        """The model name clients ask for: HOOKBUS_MODEL, else the offline stand-in's."""
        return self.model or "offline"

    def shown(self, name: str) -> str:
        """A field's value for printing: passwords in URLs and API keys as `***`."""
        value = getattr(self, name)
        if value is None:
            return "None"
        if name in SECRET_FIELDS:
            return "'***'"
        return repr(redact_url(value)) if isinstance(value, str) else repr(value)


SECRET_FIELDS = frozenset({"openai_api_key"})
_URL_PASSWORD = re.compile(r"(?P<head>//[^/@?#]*?:)[^/@?#]*@")
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)[^&#]*", re.IGNORECASE)


def redact_url(url: str) -> str:
    """`redis://:secret@host/0` -> `redis://:***@host/0` (also `user:secret@`, `?password=`)."""
    url = _URL_PASSWORD.sub(r"\g<head>***@", url)
    return _QUERY_PASSWORD.sub(r"\g<head>***", url)


def get_settings() -> Settings:
    """The settings as the environment holds them now.

    Read afresh on every call, so an agent, LLM or client built after the environment
    changed (a notebook, a test, a second agent) uses the new values; callers read them
    once when they are built, never on a per-hop path."""
    return Settings()
