"""Requests through the gateway with the real openai client, and what each one ended with.

Every request carries its own `X-Session-Id`, so the finalize log line of RequestLogger (in
the telemetry group) can be matched to it whatever the outcome, errors included.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Literal

import httpx
import openai
from openai.types.chat import ChatCompletionMessageParam
from pydantic import BaseModel

REQUEST_TIMEOUT = 120.0


class Outcome(BaseModel):
    """How one request ended, as the client saw it."""

    session_id: str
    stream: bool
    terminal: Literal["completed", "error", "cut", "timeout"]
    status_code: int | None = None
    error_code: str | None = None
    finish_reason: str | None = None
    content: str = ""
    """The answer's text; of a stream that ended in an error, the text it got before."""
    seconds: float = 0.0
    ended: float = 0.0
    """time.monotonic() when the client had its answer (or gave up)."""


@dataclass(frozen=True)
class Api:
    """An openai client for one API key, and the model the gateway serves.

    `async with` it inside the event loop that uses it: it closes its connections there."""

    client: openai.AsyncOpenAI
    model: str

    async def __aenter__(self) -> Api:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.client.close()


def client(base_url: str, api_key: str, model: str) -> Api:
    # No retries: a retry would hide the answer the gateway really gave.
    return Api(openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=REQUEST_TIMEOUT), model)


async def served_models(base_url: str, api_key: str) -> list[str]:
    """GET /v1/models through the openai client."""
    async with client(base_url, api_key, "") as api:
        return [model.id async for model in api.client.models.list()]


async def ask(api: Api, text: str, *, stream: bool, tag: str = "check") -> Outcome:
    """One chat completion; never raises for what the gateway answered."""
    session_id = f"{tag}-{uuid.uuid4().hex[:12]}"
    headers = {"X-Session-Id": session_id}
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": text}]
    started = time.monotonic()
    outcome = Outcome(session_id=session_id, stream=stream, terminal="cut")
    try:
        if stream:
            chunks = await api.client.chat.completions.create(
                model=api.model, messages=messages, stream=True, extra_headers=headers
            )
            async for chunk in chunks:
                for choice in chunk.choices:
                    # as it comes: a stream that ends in an error keeps the text before it
                    outcome.content += choice.delta.content or ""
                    if choice.finish_reason:
                        outcome.finish_reason = choice.finish_reason
        else:
            completion = await api.client.chat.completions.create(
                model=api.model, messages=messages, extra_headers=headers
            )
            outcome.content = completion.choices[0].message.content or ""
            outcome.finish_reason = completion.choices[0].finish_reason
        if outcome.finish_reason:
            outcome.terminal = "completed"
    except openai.APIStatusError as exc:
        outcome.terminal, outcome.status_code = "error", exc.status_code
        body = exc.body if isinstance(exc.body, dict) else {}
        outcome.error_code = str(body.get("code") or body.get("error", {}).get("code") or "")
    except openai.APITimeoutError:
        outcome.terminal = "timeout"
    except (openai.APIConnectionError, httpx.HTTPError):
        outcome.terminal = "cut"  # the connection ended without an answer: not terminal
    except openai.APIError as exc:  # an error event inside the stream: terminal too
        outcome.terminal, outcome.error_code = "error", str(getattr(exc, "code", "") or type(exc).__name__)
    outcome.ended = time.monotonic()
    outcome.seconds = round(outcome.ended - started, 2)
    return outcome


async def load(api: Api, count: int, text: str, *, tag: str, parallel: int = 8) -> list[Outcome]:
    """`count` requests, half streamed, at most `parallel` at once."""
    gate = asyncio.Semaphore(parallel)

    async def one(index: int) -> Outcome:
        async with gate:
            return await ask(api, text, stream=index % 2 == 0, tag=tag)

    return list(await asyncio.gather(*(one(i) for i in range(count))))
