"""The LLM adapter: the official `openai` async client against any compatible endpoint.

With no endpoint configured, the built-in offline model (hookbus.services.testing.
offline_model) is started on loopback and reached through the very same client and
HTTP path, so tests and demos exercise the production code path.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from hookbus.bus.settings import get_settings
from hookbus.services.offload import is_large, off_loop
from hookbus.skills.errors import ContextTooLong, HookError, UpstreamError


class LLM:
    """One endpoint and its credentials; a client per event loop (clients are loop-bound)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 120.0,
        max_retries: int = 2,
    ) -> None:
        settings = get_settings()
        self._base_url = base_url or settings.openai_base_url
        self._api_key = api_key or settings.openai_api_key or "hookbus-offline"
        self._timeout = timeout
        self._max_retries = max_retries
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, openai.AsyncOpenAI] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def offline(self) -> bool:
        return self._base_url is None

    @property
    def base_url(self) -> str:
        if self._base_url is None:
            from hookbus.services.testing.offline_server import shared_offline_base_url

            return shared_offline_base_url()
        return self._base_url

    def context_windows(self) -> Mapping[str, int]:
        """Context windows this endpoint is known to have, by model name (the offline
        model's own; none for a configured endpoint: the production table applies)."""
        if self._base_url is None:
            from hookbus.services.testing.offline_model import MODEL_WINDOWS

            return MODEL_WINDOWS
        return {}

    def client(self) -> openai.AsyncOpenAI:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = openai.AsyncOpenAI(
                base_url=self.base_url,
                api_key=self._api_key,
                timeout=self._timeout,
                max_retries=self._max_retries,
            )
            self._clients[loop] = client
        return client

    async def complete(
        self, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> ChatCompletion:
        try:
            completion: ChatCompletion = await create_chat_completion(
                self.client(), {"model": model, "messages": messages, **_tool_args(tools)}
            )
            return completion
        except openai.APIError as exc:
            raise llm_error(exc) from exc

    async def stream(
        self, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> AsyncGenerator[ChatCompletionChunk, None]:
        try:
            response = await create_chat_completion(
                self.client(),
                {
                    "model": model,
                    "messages": messages,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                    **_tool_args(tools),
                },
            )
            async with response:
                async for chunk in response:
                    yield chunk
        except openai.APIError as exc:
            raise llm_error(exc) from exc


async def create_chat_completion(client: openai.AsyncOpenAI, arguments: dict[str, Any]) -> Any:
    """What `client.chat.completions.create(**arguments)` does, minus its transform.

    `create` walks every message and field in Python on the event loop to adapt typed
    params (12 s for 123,000 tiny messages); our arguments are plain JSON already, so
    the body is encoded as is (off the loop when large) and posted through the same
    client: same HTTP stack, retries, errors and stream parsing. Returns a
    ChatCompletion, or an AsyncStream of chunks when `arguments["stream"]`.
    """
    large = is_large(arguments.get("messages"))
    body = await off_loop(large, json_body, arguments)
    return await client.post(
        "/chat/completions",
        content=body,  # the client's default Content-Type is application/json
        cast_to=ChatCompletion,
        stream=bool(arguments.get("stream")),
        stream_cls=openai.AsyncStream[ChatCompletionChunk],
    )


def json_body(arguments: dict[str, Any]) -> bytes:
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _tool_args(tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"tools": tools} if tools else {}


def llm_error(exc: openai.APIError) -> HookError:
    """Turn what the endpoint said into the structured error the client will see."""
    if isinstance(exc, openai.APIStatusError):
        code = _error_code(exc.body)
        if code == "context_length_exceeded":
            return ContextTooLong(exc.message)
        status = 404 if exc.status_code == 404 else 502
        return UpstreamError(
            status,
            code or "llm_error",
            f"the LLM endpoint answered {exc.status_code}: {exc.message}",
            {"upstream_status": exc.status_code},
        )
    if isinstance(exc, openai.APITimeoutError):
        return UpstreamError(504, "llm_timeout", "the LLM endpoint did not answer in time")
    return UpstreamError(502, "llm_unreachable", f"the LLM endpoint could not be reached: {exc.message}")


def _error_code(body: object) -> str | None:
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("code"):
            return str(inner["code"])
    return None
