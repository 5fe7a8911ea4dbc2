"""The LLM adapter: the official `openai` async client against any compatible endpoint.

With no endpoint configured, the built-in offline model (hookbus.services.testing.
offline_model) is started on loopback and reached through the very same client and
HTTP path, so tests and demos exercise the production code path. That fallback is for an
`Agent` used in-process; the orchestrator service asks `require_endpoint` first and refuses
to start on it unless the offline model was asked for by name (`HOOKBUS_MODEL=offline`).

What it does for every endpoint (OpenAI, vLLM, llama.cpp):
- sends the messages in the form all of them accept (`upstream_messages`), the request's
  model settings, and `tool_choice: "auto"` when tools are offered and none was chosen
  (llama.cpp's server offers no tools without it);
- retries only a call that could not connect (`HOOKBUS_LLM_RETRIES`, default 1), on a
  connection of its own (`fresh_client`), never a kept-alive one: an
  answer (429, 5xx) or a timeout goes straight back, since the client retries those itself
  and retrying here too multiplied the calls; a generation is never sent twice for being
  slow (`HOOKBUS_LLM_TIMEOUT`, default 600 s);
- maps the endpoint's errors to what the client should see (`llm_error`), and an answer
  that is no OpenAI answer (HTML, a line that is not JSON, an array) to a 502
  `upstream_bad_response` in words (`unreadable_answer`);
- treats a stream that ends with no chunk as an upstream error, and one with chunks but no
  finish_reason (cut off: its text unfinished, a tool call's arguments perhaps half a JSON)
  as a 502 `upstream_stream_truncated`; a finish_reason without the closing `[DONE]` is a
  complete answer;
- raises `EmptyAnswer` (502 `empty_answer`) for an answer with no text and no tool call, or,
  under `tool_choice: "auto"`, with nothing but a tool-call marker (`functions.NAME:`, NAME
  an offered tool): llama-cpp-python's `chatml-function-calling` answers so whenever the
  model answers in text (its grammar for the text allows only a marker or the end of the
  turn). Under "auto" a stream's chunks are held while its text may still be nothing but
  that, so nothing of such an answer reaches the caller, which may ask again with `"none"`
  (the agent does);
- counts the usage with tiktoken when a stream brings none, marked `estimated: true`.

The client's HTTP stack (`http`, `HOOKBUS_LLM_HTTP`): aiohttp costs 0.68-0.73x the CPU
of httpx per streamed call, and 0.83x the orchestrator's CPU per request of the cost bench
(tests/bench/RESULTS.md, "Why the hop path is built as it is"), but an
aiohttp session must be closed on its own loop, so it is for an owner that calls
`aclose()` before its loop ends: the orchestrator service picks it when nothing was
chosen; an Agent run in-process keeps httpx, which needs no closing.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any, Literal, TypeVar

import openai
import structlog
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from hookbus.bus.settings import OFFLINE_MODEL, get_settings
from hookbus.services.observability import tracing
from hookbus.services.orchestrator.compaction.token_scale import TokenScale, tiktoken_knows
from hookbus.services.orchestrator.compaction.tokens import count_messages, count_text
from hookbus.services.orchestrator.llm import answers, endpoint
from hookbus.services.orchestrator.llm.answers import (
    EmptyAnswer,
    completion_chunks,
    estimated_usage,
    response_text,
    unreadable_answer,
)
from hookbus.services.orchestrator.llm.errors import llm_error, timed_out
from hookbus.services.orchestrator.llm.wire import create_chat_completion, request_arguments
from hookbus.skills.errors import UpstreamError
from hookbus.skills.model_settings import ModelSettings

log = structlog.get_logger("hookbus.llm")

T = TypeVar("T")

RETRY_PAUSE = 0.2
"""Seconds before retrying a call that could not connect."""

HttpStack = Literal["httpx", "aiohttp"]



class LLM:
    """One endpoint and its credentials; a client per event loop (clients are loop-bound).

    `timeout` (seconds per call), `retries` (of calls that could not connect) and `http`
    (the client's HTTP stack; None: not chosen, httpx) default to `HOOKBUS_LLM_TIMEOUT`,
    `HOOKBUS_LLM_RETRIES` and `HOOKBUS_LLM_HTTP`. With aiohttp, call `aclose()` on the
    loop that used the client before that loop ends."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | None = None,
        retries: int | None = None,
        http: HttpStack | None = None,
    ) -> None:
        settings = get_settings()
        self._base_url = base_url or settings.openai_base_url
        self._api_key = api_key or settings.openai_api_key or "hookbus-offline"
        self.timeout = timeout if timeout is not None else settings.llm_timeout
        self.retries = retries if retries is not None else settings.llm_retries
        self.http: HttpStack | None = http or settings.llm_http
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, openai.AsyncOpenAI] = (
            weakref.WeakKeyDictionary()
        )
        self._fresh_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, openai.AsyncOpenAI] = (
            weakref.WeakKeyDictionary()
        )
        self.token_scale = TokenScale(exact=self.offline)
        self.unstreamed_tool_rounds = False
        """Set once the endpoint ended a stream with `tool_choice: "auto"` at once and
        answered the same call unstreamed (llama-cpp-python's `chatml-function-calling`
        format): such calls go unstreamed."""

    @property
    def offline(self) -> bool:
        """No endpoint configured: calls go to the built-in offline model."""
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
        return self._loop_client(
            self._clients,
            lambda: openai.DefaultAioHttpClient(timeout=self.timeout) if self.http == "aiohttp" else None,
        )

    def fresh_client(self) -> openai.AsyncOpenAI:
        """The running loop's client for retries, which keeps no connection alive: every call
        opens a connection of its own. A call that could not connect had most often sent on
        a kept-alive connection the endpoint had just closed (its idle timeout, a busy
        server), and the shared client's next kept-alive connection was as likely closed:
        both tries failed (one 502 in about 18,000 requests under saturation). httpx, on
        either stack: its pool closes a connection at once when it may keep none."""
        limits = type(openai.DEFAULT_CONNECTION_LIMITS)(max_connections=None, max_keepalive_connections=0)
        return self._loop_client(
            self._fresh_clients, lambda: openai.DefaultAsyncHttpxClient(timeout=self.timeout, limits=limits)
        )

    def _loop_client(
        self,
        clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, openai.AsyncOpenAI],
        http_client: Callable[[], Any],
    ) -> openai.AsyncOpenAI:
        loop = asyncio.get_running_loop()
        client = clients.get(loop)
        if client is None:
            client = openai.AsyncOpenAI(
                base_url=self.base_url,
                api_key=self._api_key,
                timeout=self.timeout,
                max_retries=0,  # our own, narrower retry: see the module docstring
                http_client=http_client(),
            )
            clients[loop] = client
        return client

    async def aclose(self) -> None:
        """Close the clients of the running loop (their connections, the aiohttp session);
        the next call opens new ones. Idempotent."""
        loop = asyncio.get_running_loop()
        for clients in (self._clients, self._fresh_clients):
            client = clients.pop(loop, None)
            if client is not None:
                await client.close()

    async def _connecting(self, call: Callable[[openai.AsyncOpenAI], Awaitable[T]]) -> T:
        """`call(client)`, again (at most `retries` times) on a new connection when it could
        not reach the endpoint."""
        attempt = 0
        client = self.client()
        while True:
            try:
                return await call(client)
            except openai.APIConnectionError as exc:
                if timed_out(exc) or attempt >= self.retries:
                    raise
                attempt += 1
                log.warning("llm_connect_retry", attempt=attempt, error=str(exc))
                await asyncio.sleep(RETRY_PAUSE)
                client = self.fresh_client()

    async def learn_model(self, model: str, *, window: bool) -> int | None:
        """Ask the endpoint once per process what it knows of `model`: its context window
        (when `window`) and how its tokenizer counts; returns the window, or None where the
        endpoint does not say. Callers ask only when compaction needs the answer (the
        compactor's `within_reach`), never for a request not yet admitted: the probe is up to
        five HTTP requests an audited upstream would otherwise see unexplained. The first
        caller asks; a concurrent one goes on without the answer, as if the endpoint did not
        say. Nothing is asked of the offline model, nor for a model tiktoken knows (OpenAI's:
        the table's window and a scale of 1.0 hold)."""
        facts = await endpoint.learn(
            self.base_url, self._api_key, model, window=window, known=self.offline or tiktoken_knows(model)
        )
        if facts is None:
            return None
        if facts.tokenizer is not None:
            self.token_scale.probed(model, *facts.tokenizer)
        return facts.window

    def _report_usage(
        self, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, usage: CompletionUsage
    ) -> None:
        """The endpoint's prompt count against ours of the same prompt: the tools offered
        too, which it counts with the messages. Counting the messages alone made a short
        conversation offering tools read as a tokenizer 3.2x tiktoken's (Gemma 3 on
        llama-cpp-python, where the tokenizer says 1.1x), and the 2048-token window
        compaction budgets against as 640."""
        if not self.token_scale.exact:
            counted = count_messages(messages) + (count_text(json.dumps(tools)) if tools else 0)
            self.token_scale.report(model, usage.prompt_tokens, counted)

    async def complete(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        settings: ModelSettings | None = None,
    ) -> ChatCompletion:
        arguments = request_arguments(model, messages, tools, settings)
        with tracing.chat_span(model, self, messages, tools, stream=False, settings=settings) as span:
            try:
                response: ChatCompletion = await self._connecting(
                    lambda client: create_chat_completion(client, arguments)
                )
            except openai.APIError as exc:
                raise llm_error(exc) from exc
            except json.JSONDecodeError as exc:
                raise unreadable_answer("its body is not JSON") from exc
            if not answers.is_completion(response):
                raise unreadable_answer("it is not a chat completion")
            if not response.choices or answers.said_nothing(response.choices[0].message, answers.tool_markers(arguments)):
                raise EmptyAnswer(
                    response.choices[0].finish_reason if response.choices else None,
                    response.choices[0].message.content if response.choices else None,
                    under_auto=answers.under_auto(arguments), usage=response.usage,
                )
            if response.usage is None:
                response.usage = estimated_usage(messages, response_text(response))
            else:
                self._report_usage(model, messages, tools, response.usage)
            span.response(response)
            return response

    async def stream(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        settings: ModelSettings | None = None,
    ) -> AsyncGenerator[ChatCompletionChunk, None]:
        arguments = request_arguments(model, messages, tools, settings)
        if self.unstreamed_tool_rounds and arguments.get("tool_choice") == "auto":
            async for chunk in self._unstreamed(model, messages, tools, settings):
                yield chunk
            return
        arguments.update(stream=True, stream_options={"include_usage": True})
        saw_choice = saw_call = False
        under_auto = holding = answers.under_auto(arguments)
        markers = answers.tool_markers(arguments)
        usage: CompletionUsage | None = None
        finish_reason: str | None = None
        produced: list[str] = []
        held: list[ChatCompletionChunk] = []
        """Under "auto", the chunks while the answer may still say nothing (`holding`): such
        an answer is asked again, and the caller sees only the second answer's chunks."""
        with tracing.chat_span(model, self, messages, tools, stream=True, settings=settings) as span:
            try:
                response = await self._connecting(
                    lambda client: create_chat_completion(client, arguments)
                )
                async with response:
                    async for chunk in response:
                        saw_choice = saw_choice or bool(chunk.choices)
                        for choice in chunk.choices:
                            saw_call = saw_call or bool(choice.delta.tool_calls)
                            finish_reason = choice.finish_reason or finish_reason
                        if chunk.usage is not None:
                            usage = chunk.usage
                            self._report_usage(model, messages, tools, chunk.usage)
                        produced.extend(answers.chunk_texts(chunk))
                        span.chunk(chunk)
                        if not holding:
                            yield chunk
                            continue
                        held.append(chunk)
                        holding = not saw_call and answers.may_say_nothing("".join(produced), markers)
                        if not holding:
                            for earlier in held:
                                yield earlier
                            held.clear()
            except openai.APIError as exc:
                raise llm_error(exc) from exc
            except json.JSONDecodeError as exc:
                raise unreadable_answer("an event of its stream is not JSON") from exc
            if not saw_choice:
                # Nothing was generated, so asking again unstreamed sends no generation twice,
                # and its answer says what the empty stream did not: the real error (a prompt
                # past the window), or an answer (llama-cpp-python ends a stream that carries
                # `tool_choice: "auto"` at once: its tool rounds go unstreamed from then on).
                # An empty answer to it is an answer too: the tool rounds still go unstreamed.
                log.warning("llm_empty_stream_asking_unstreamed", model=model, tool_choice=arguments.get("tool_choice"))
                try:
                    async for chunk in self._unstreamed(model, messages, tools, settings):
                        yield chunk
                except EmptyAnswer:
                    self._unstream_tool_rounds(model, under_auto)
                    raise
                self._unstream_tool_rounds(model, under_auto)
                return
            if finish_reason is None:
                raise UpstreamError(
                    502, "upstream_stream_truncated",
                    "the LLM endpoint's stream ended before the answer did (no finish_reason): "
                    "what came is incomplete, and no tool call of it was made",
                )
            if not saw_call and answers.says_nothing("".join(produced), markers):
                raise EmptyAnswer(finish_reason, "".join(produced), under_auto=under_auto, usage=usage)
            for earlier in held:  # it ended while its text could still have been a marker
                yield earlier
            if usage is None:
                estimate = answers.usage_chunk(estimated_usage(messages, "".join(produced)), model)
                span.chunk(estimate)
                yield estimate

    def _unstream_tool_rounds(self, model: str, under_auto: bool) -> None:
        """After an empty stream under "auto" that was answered unstreamed."""
        if under_auto and not self.unstreamed_tool_rounds:
            self.unstreamed_tool_rounds = True
            log.warning("llm_tool_rounds_unstreamed", model=model, base_url=self.base_url)

    async def _unstreamed(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        settings: ModelSettings | None,
    ) -> AsyncGenerator[ChatCompletionChunk, None]:
        """One call, not streamed, handed on as the chunks a stream of it would have been."""
        completion = await self.complete(model, messages, tools, settings)
        for chunk in completion_chunks(completion):
            yield chunk


class NoEndpoint(RuntimeError):
    """A service that must answer with a real model has no LLM endpoint configured."""


def require_endpoint(llm: LLM) -> None:
    """Refuse to serve with the offline stand-in model unless it was asked for by name.

    The orchestrator service (`hookbus orchestrator`) calls this before it starts: a
    deployment that forgot `OPENAI_BASE_URL` must fail at once, not answer its users with a
    test double. `HOOKBUS_MODEL=offline` asks for the offline model on purpose (`hookbus run`
    sets it). An `Agent` used in-process does not ask: it falls back.
    """
    if llm.offline and get_settings().model != OFFLINE_MODEL:
        raise NoEndpoint(
            "no LLM endpoint: set OPENAI_BASE_URL to an OpenAI-compatible endpoint (with "
            f"OPENAI_API_KEY and HOOKBUS_MODEL), or set HOOKBUS_MODEL={OFFLINE_MODEL} to run the "
            "built-in offline stand-in model on purpose"
        )
