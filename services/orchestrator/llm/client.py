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

import aiohttp
import httpx
import openai
import structlog
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from pydantic import BaseModel, ValidationError

from hookbus.bus.settings import OFFLINE_MODEL, get_settings
from hookbus.services.observability import tracing
from hookbus.services.orchestrator.compaction.token_scale import (
    SAMPLE_TEXT,
    TokenScale,
    tiktoken_knows,
)
from hookbus.services.orchestrator.compaction.tokens import count_messages, count_text
from hookbus.services.process.offload import is_large, off_loop
from hookbus.skills.errors import ContextTooLong, ServiceError, UpstreamError
from hookbus.skills.model_settings import ModelSettings

log = structlog.get_logger("hookbus.llm")

T = TypeVar("T")

RETRY_PAUSE = 0.2
"""Seconds before retrying a call that could not connect."""
PROBE_TIMEOUT = 5.0
"""Seconds to wait for an endpoint to say its context window."""

HttpStack = Literal["httpx", "aiohttp"]

CAUSES_LOOKED_AT = 8
"""How deep `timed_out` follows an error's causes (the transport's chain is 2-3 long)."""


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
        key = (self.base_url, model)
        if key in _LEARNED:
            facts = _LEARNED[key]
        elif self.offline or tiktoken_knows(model):
            facts = _LEARNED[key] = EndpointFacts()
        else:
            _LEARNED[key] = None  # taken: no second probe while this one runs
            try:
                facts = _LEARNED[key] = await self._ask_endpoint(model, window)
            except BaseException:  # cancelled with its request: the next one asks
                del _LEARNED[key]
                raise
        if facts is None:
            return None
        if facts.tokenizer is not None:
            self.token_scale.probed(model, *facts.tokenizer)
        return facts.window

    async def _ask_endpoint(self, model: str, window: bool) -> EndpointFacts:
        headers = {"Authorization": f"Bearer {self._api_key}"}
        root = self.base_url.rstrip("/").removesuffix("/v1")
        facts = EndpointFacts()
        try:
            async with httpx.AsyncClient(timeout=PROBE_TIMEOUT, headers=headers) as http:
                if window:
                    facts.window = await _served_window(http, root, self.base_url, model)
                facts.tokenizer = await _tokenizer_counts(http, root, model)
        except Exception:  # noqa: BLE001 - the table and the margin apply when it cannot tell
            log.warning("endpoint_probe_failed", model=model, exc_info=True)
        log.info("endpoint_probed", model=model, window=facts.window, tokenizer=facts.tokenizer)
        return facts

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
            if not _is_completion(response):
                raise unreadable_answer("it is not a chat completion")
            if not response.choices or _said_nothing(response.choices[0].message, _markers(arguments)):
                raise EmptyAnswer(
                    response.choices[0].finish_reason if response.choices else None,
                    response.choices[0].message.content if response.choices else None,
                    under_auto=_under_auto(arguments), usage=response.usage,
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
        under_auto = holding = _under_auto(arguments)
        markers = _markers(arguments)
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
                        produced.extend(_chunk_texts(chunk))
                        span.chunk(chunk)
                        if not holding:
                            yield chunk
                            continue
                        held.append(chunk)
                        holding = not saw_call and _may_say_nothing("".join(produced), markers)
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
            if not saw_call and _says_nothing("".join(produced), markers):
                raise EmptyAnswer(finish_reason, "".join(produced), under_auto=under_auto, usage=usage)
            for earlier in held:  # it ended while its text could still have been a marker
                yield earlier
            if usage is None:
                estimate = _usage_chunk(estimated_usage(messages, "".join(produced)), model)
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


async def create_chat_completion(client: openai.AsyncOpenAI, arguments: dict[str, Any]) -> Any:
    """What `client.chat.completions.create(**arguments)` does, minus its transform.

    `create` walks every message and field in Python on the event loop to adapt typed
    params (12 s for 123,000 tiny messages); our arguments are plain JSON already, so
    the body is encoded as is (off the loop when large) and posted through the same
    client: same HTTP stack, retries, errors and SSE reading. Returns a
    ChatCompletion, or an AsyncStream of chunks (built by StreamedChunk) when
    `arguments["stream"]`.
    """
    large = is_large(arguments.get("messages"))
    body = await off_loop(large, json_body, arguments)
    return await client.post(
        "/chat/completions",
        content=body,  # the client's default Content-Type is application/json
        cast_to=ChatCompletion,
        stream=bool(arguments.get("stream")),
        stream_cls=openai.AsyncStream[StreamedChunk],
    )


class StreamedChunk:
    """How the client builds each chunk of a stream (its model-builder protocol: a
    `cast_to` with a `build` classmethod is asked to build the value): validated by
    pydantic-core in one call, about 30 times cheaper than the client's lenient
    recursive construct (10 vs 316 us a chunk; it was 8% of the orchestrator's CPU
    under the cost bench). A chunk the model refuses (an endpoint's odd field) is built
    leniently, as the client builds every chunk, when its choices still have the shape
    of a chunk's; anything else (an array, `{"choices": "many"}`) is the endpoint's
    garbage: a 502 `upstream_bad_response`. The SSE reading, the `error` event and the
    HTTP errors stay the client's."""

    @classmethod
    def build(cls, *, response: object, data: object) -> ChatCompletionChunk:
        if not isinstance(data, dict):
            raise unreadable_answer("an event of its stream is not a chunk")
        try:
            return ChatCompletionChunk.model_validate(data)
        except ValidationError:
            if not _choices_hold(data, "delta"):
                raise unreadable_answer("an event of its stream is not a chunk") from None
            return ChatCompletionChunk.construct(**data)


def unreadable_answer(what: str) -> UpstreamError:
    """The 502 for an answer that is no OpenAI answer (HTML, a broken line, an array):
    the endpoint failed us, whatever Python made of its bytes."""
    return UpstreamError(502, "upstream_bad_response", f"the LLM endpoint's answer could not be read: {what}")


def _choices_hold(data: dict[str, Any], part: str) -> bool:
    """Whether `data["choices"]` (absent: none) is a list of objects whose `part` (the
    chunk's `delta`, the completion's `message`), where present, is an object."""
    choices = data.get("choices", [])
    return isinstance(choices, list) and all(
        isinstance(choice, dict) and isinstance(choice.get(part, {}), dict) for choice in choices
    )


def _is_completion(response: object) -> bool:
    """Whether the client's (lenient) completion has the shape the agent reads: a list
    of choices, each with a message."""
    choices = getattr(response, "choices", None)
    return isinstance(response, ChatCompletion) and isinstance(choices, list) and all(
        isinstance(getattr(choice, "message", None), ChatCompletionMessage) for choice in choices
    )


def json_body(arguments: dict[str, Any]) -> bytes:
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


async def _get_json(http: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
    try:
        response = await http.get(url)
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None


async def _post_json(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any] | None:
    try:
        response = await http.post(url, json=body)
        answer = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


def _token_count(answer: dict[str, Any] | None) -> int | None:
    """A tokenize endpoint's count: `count` (vLLM, llama-cpp-python's /count) or its tokens."""
    if not answer:
        return None
    if isinstance(answer.get("count"), int):
        return int(answer["count"])
    tokens = answer.get("tokens")
    return len(tokens) if isinstance(tokens, list) and tokens else None


def _n_ctx(props: dict[str, Any] | None) -> int | None:
    """llama.cpp's served context size from its /props (newer servers nest it)."""
    if not props:
        return None
    for holder in (props.get("default_generation_settings") or {}, props):
        value = holder.get("n_ctx") if isinstance(holder, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def request_arguments(
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    settings: ModelSettings | None,
) -> dict[str, Any]:
    """The `chat.completions.create` arguments of one call.

    `tool_choice` and `parallel_tool_calls` go only with tools (OpenAI refuses them
    without); with tools and no `tool_choice`, "auto" is sent explicitly."""
    arguments: dict[str, Any] = {"model": model, "messages": upstream_messages(messages)}
    given = settings.given() if settings is not None else {}
    choice = given.pop("tool_choice", None)
    parallel = given.pop("parallel_tool_calls", None)
    arguments.update(given)
    if tools:
        arguments["tools"] = tools
        arguments["tool_choice"] = choice or "auto"
        if parallel is not None:
            arguments["parallel_tool_calls"] = parallel
    return arguments


def upstream_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages in the form OpenAI, vLLM and llama.cpp all accept: no legacy
    `function_call`, no null fields, and an assistant message with tool calls and no
    text has `content: ""` (llama.cpp's server answers `content: null` with a 500)."""
    sent = []
    for message in messages:
        clean = {k: v for k, v in message.items() if v is not None and k != "function_call"}
        if clean.get("role") == "assistant" and "content" not in clean:
            clean["content"] = ""
        sent.append(clean)
    return sent


def response_text(response: ChatCompletion) -> str:
    if not response.choices:
        return ""
    message = response.choices[0].message
    arguments = "".join(c.function.arguments for c in message.tool_calls or () if hasattr(c, "function"))
    return (message.content or "") + arguments


def completion_chunks(completion: ChatCompletion) -> list[ChatCompletionChunk]:
    """A completion as the chunks of its stream: its text and tool calls, the finish chunk,
    then the usage chunk."""
    choice = completion.choices[0]
    delta: dict[str, Any] = {"role": "assistant", "content": choice.message.content or ""}
    if choice.message.tool_calls:
        delta["tool_calls"] = [
            {"index": i, **call.model_dump(exclude_none=True)} for i, call in enumerate(choice.message.tool_calls)
        ]
    head = {"id": completion.id, "object": "chat.completion.chunk", "created": completion.created,
            "model": completion.model}
    chunks = [
        {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice.finish_reason}]},
    ]
    if completion.usage is not None:
        chunks.append({**head, "choices": [], "usage": completion.usage.model_dump()})
    return [ChatCompletionChunk.model_validate(chunk) for chunk in chunks]


def _said_nothing(message: Any, markers: tuple[str, ...]) -> bool:
    return not message.tool_calls and _says_nothing(message.content or "", markers)


def _says_nothing(text: str, markers: tuple[str, ...]) -> bool:
    """No text, or nothing but one of `markers`."""
    return not text or text.strip() in markers


def _may_say_nothing(text: str, markers: tuple[str, ...]) -> bool:
    """Whether a text so far may still end as no text or nothing but one of `markers`."""
    return not text or any(marker.startswith(text.lstrip()) for marker in markers)


def _under_auto(arguments: dict[str, Any]) -> bool:
    """Whether the call offered tools and left the choice to the model."""
    return arguments.get("tool_choice") == "auto"


def _markers(arguments: dict[str, Any]) -> tuple[str, ...]:
    """Under "auto", the tool-call markers that are no answer as text: llama-cpp-python's
    `chatml-function-calling` format, asked to answer in text under "auto", can only end
    the turn or write `functions.NAME:` for an offered tool (and leaves it as the text)."""
    if not _under_auto(arguments):
        return ()
    return tuple(f"functions.{tool['function']['name']}:" for tool in arguments["tools"] if tool.get("function"))


class EmptyAnswer(UpstreamError):
    """An answer with no text and no tool call (or, under "auto", nothing but a tool-call
    marker: `_markers`): never passed on as an empty success, since a client (or `hookbus
    send`) cannot tell it from a model that had nothing to say.

    `under_auto`: the call offered tools under `tool_choice: "auto"`, and nothing of the
    answer reached the caller (a stream's chunks were held), so the call can be asked again
    with `"none"`. `usage`: what the empty answer cost, as the endpoint reported it."""

    def __init__(
        self, finish_reason: str | None, text: str | None, *, under_auto: bool, usage: CompletionUsage | None
    ) -> None:
        said = f"no tool call, no text but {text.strip()!r}" if text and text.strip() else "no text and no tool call"
        super().__init__(
            502, "empty_answer", f"the model's answer said nothing: {said} (finish_reason {finish_reason or 'none'})"
        )
        self.finish_reason = finish_reason
        self.under_auto = under_auto
        self.usage = usage


def _chunk_texts(chunk: ChatCompletionChunk) -> list[str]:
    texts: list[str] = []
    for choice in chunk.choices:
        if choice.delta.content:
            texts.append(choice.delta.content)
        for call in choice.delta.tool_calls or ():
            if call.function is not None and call.function.arguments:
                texts.append(call.function.arguments)
    return texts


def estimated_usage(messages: list[dict[str, Any]], produced: str) -> CompletionUsage:
    """Usage counted with tiktoken, for an endpoint that sent none; `estimated` says so."""
    prompt = count_messages(messages)
    completion = count_text(produced)
    usage = CompletionUsage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
    usage.estimated = True  # type: ignore[attr-defined]  # openai's models keep extra fields
    return usage


def _usage_chunk(usage: CompletionUsage, model: str) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate(
        {"id": "", "object": "chat.completion.chunk", "created": 0, "model": model,
         "choices": [], "usage": usage.model_dump()}
    )


_STATUS_SEEN = {400: 400, 404: 404, 408: 504, 413: 400, 422: 400, 429: 429, 503: 503, 504: 504}
"""Upstream status -> the client's; every other 4xx (401, 403: the operator's key) and 5xx
is a 502, the endpoint having failed us."""


class EndpointFacts(BaseModel):
    """What an endpoint said of one model: its window, and its tokenizer's count of
    SAMPLE_TEXT against ours (theirs, ours); None where it did not say."""

    window: int | None = None
    tokenizer: tuple[int, int] | None = None


_LEARNED: dict[tuple[str, str], EndpointFacts | None] = {}
"""Per (base url, model), what `LLM.learn_model` found; None while the one probe runs."""


async def _served_window(http: httpx.AsyncClient, root: str, base_url: str, model: str) -> int | None:
    """llama.cpp's `GET /props` (`n_ctx`), vLLM's `GET /v1/models` (`max_model_len`)."""
    n_ctx = _n_ctx(await _get_json(http, f"{root}/props"))
    if n_ctx:
        return n_ctx
    models = await _get_json(http, f"{base_url.rstrip('/')}/models")
    for card in (models or {}).get("data") or ():
        if isinstance(card, dict) and card.get("id") == model and isinstance(card.get("max_model_len"), int):
            return int(card["max_model_len"])
    return None


async def _tokenizer_counts(http: httpx.AsyncClient, root: str, model: str) -> tuple[int, int] | None:
    """The endpoint's count of SAMPLE_TEXT and ours: llama-cpp-python's `POST /extras/tokenize`,
    llama.cpp's and vLLM's `POST /tokenize`, the first that answers."""
    attempts = (
        (f"{root}/extras/tokenize", {"input": SAMPLE_TEXT, "model": model}),  # llama-cpp-python
        (f"{root}/tokenize", {"content": SAMPLE_TEXT}),  # llama.cpp
        (f"{root}/tokenize", {"model": model, "prompt": SAMPLE_TEXT}),  # vLLM
    )
    for url, body in attempts:
        theirs = _token_count(await _post_json(http, url, body))
        if theirs:
            return theirs, count_text(SAMPLE_TEXT)
    return None


def llm_error(exc: openai.APIError) -> ServiceError:
    """Turn what the endpoint said into the error the client will see, keeping its message,
    code and param (and Retry-After of a 429, in `details.retry_after`)."""
    if isinstance(exc, openai.APIStatusError):
        inner = _error_object(exc.body)
        code = inner.get("code")
        message = str(inner.get("message") or exc.message)
        if code == "context_length_exceeded" or inner.get("type") == "exceed_context_size_error":
            return ContextTooLong(message)
        status = _STATUS_SEEN.get(exc.status_code, 502)
        details: dict[str, Any] = {"upstream_status": exc.status_code}
        if inner.get("param"):
            details["param"] = inner["param"]
        retry_after = _retry_after(exc.response.headers)
        if retry_after is not None:
            details["retry_after"] = retry_after
        default_code = {429: "rate_limit_exceeded", 400: "invalid_request"}.get(status, "llm_error")
        return UpstreamError(status, str(code or default_code), message, details)
    if timed_out(exc):
        return UpstreamError(504, "llm_timeout", "the LLM endpoint did not answer in time")
    return UpstreamError(502, "llm_unreachable", f"the LLM endpoint could not be reached: {exc.message}")


def timed_out(exc: openai.APIError) -> bool:
    """Whether the call ran out of time, rather than losing its connection. The aiohttp
    transport reports every aiohttp connection error as a timeout (its map sends
    `ClientConnectionError` to `ConnectTimeout`), an endpoint that hung up without an
    answer included; what aiohttp raised, in the chain of causes, tells the two apart."""
    if not isinstance(exc, openai.APITimeoutError):
        return False
    cause: BaseException | None = exc.__cause__
    for _ in range(CAUSES_LOOKED_AT):
        if cause is None:
            break
        if isinstance(cause, aiohttp.ClientConnectionError):
            return isinstance(cause, TimeoutError)  # aiohttp's timeouts are TimeoutErrors
        cause = cause.__cause__ or cause.__context__
    return True


def _error_object(body: object) -> dict[str, Any]:
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            return inner
    return {}


def _retry_after(headers: Mapping[str, str]) -> str | None:
    """Retry-After as the endpoint gave it (seconds, or from `retry-after-ms`)."""
    value = headers.get("retry-after")
    if value:
        return value
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return str(max(1, round(float(millis) / 1000)))
        except ValueError:
            return None
    return None
