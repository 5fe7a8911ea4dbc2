"""`POST /v1/chat/completions`: one OpenAI request onto the queue, its answer back out.

The gateway runs no agent code: it checks the caller and the body, `submit`s a
RequestEnvelope through the bus client and relays the items of the request's response
stream.

- Not streamed: the final completion as JSON, or the structured error as its HTTP status.
- Streamed: the gateway waits for the first item before it sends headers, so an error
  raised before the first chunk (a 402 from a billing hook in `on_connection`, say) is a
  real HTTP error response, not a 200 stream. Then every chunk goes out as
  `data: {chunk}\\n\\n` and the stream ends with `data: [DONE]\\n\\n`. The usage-only chunk
  the agent sends last is forwarded only if the request asked for it
  (`stream_options.include_usage`). An error after the first chunk arrives as
  `data: {"error": {...}}\\n\\n`, then `data: [DONE]\\n\\n`, and the stream ends cleanly.
- The agent's own tool rounds never show as tool-call deltas (one assistant turn, see
  hookbus.services.orchestrator.streaming.turn_stream); while a server-side tool runs, an SSE comment
  line `: hookbus: tool NAME running` (then `... done`) goes out, which SSE clients ignore.
- A client that disconnects before its answer ended gets its request cancelled
  (hookbus.services.gateway.cancel).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import structlog
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from hookbus.bus.connection.retrying import RECONNECT_ERRORS
from hookbus.bus.wire.envelopes import RequestEnvelope, ResponseItem
from hookbus.services.gateway.cancel import CLIENT_DISCONNECTED, CLIENT_STALLED, request_cancel
from hookbus.services.gateway.errors import GatewayError, error_body, invalid_body
from hookbus.services.gateway.models import SESSION_ID_MAX, ChatCompletionRequest
from hookbus.services.gateway.request_body import is_large_document, read_json_body
from hookbus.services.gateway.sse import (
    DONE,
    ClientGone,
    DisconnectWatcher,
    SSEResponse,
    sse_comment,
    sse_event,
)
from hookbus.services.gateway.state import Gateway, gateway_of
from hookbus.services.process.offload import is_large, off_loop
from hookbus.skills import AuthInfo, BusUnavailable, HookbusError, ServiceError

log = structlog.get_logger("hookbus.gateway")

COMPLETION_ID_HEADER = "x-hookbus-completion-id"
RESERVED_METADATA = frozenset({"completion_id", "model", "agent_name"})
Body = TypeVar("Body", bound=BaseModel)


async def chat_completions(request: Request) -> Response:
    gw = gateway_of(request)
    started = time.perf_counter()
    auth = gw.authenticate(request)
    payload = await read_payload(request, gw, ChatCompletionRequest)
    if payload is None:
        return Response(status_code=499)
    submitted = await submit_chat(request, gw, auth, payload)
    if payload.stream:
        return await _streamed(request, gw, submitted, payload, started)
    completion = await final_completion(request, gw, submitted)
    if completion is None:
        return Response(status_code=499)
    return JSONResponse(completion, headers={COMPLETION_ID_HEADER: submitted.completion_id})


async def submit_chat(
    request: Request, gw: Gateway, auth: AuthInfo, payload: ChatCompletionRequest,
    *, completion_id: str | None = None,
) -> RequestEnvelope:
    """Put a checked chat request on the queue (the one path both OpenAI APIs take)."""
    if payload.model not in gw.models:
        raise GatewayError(
            404, "model_not_found",
            f"The model `{payload.model}` does not exist or you do not have access to it. "
            f"Available: {', '.join(gw.models)}.",
            param="model",
        )
    session_id = session_of(request, payload)
    metadata = {k: v for k, v in (payload.metadata or {}).items() if k not in RESERVED_METADATA}
    try:
        submitted = await gw.client.submit(
            await off_loop(is_large(payload.messages), payload.message_dicts),
            stream=bool(payload.stream),
            session_id=session_id,
            auth=auth,
            metadata=metadata,
            completion_id=completion_id,
            tools=payload.tool_dicts(),
            model_settings=payload.model_settings(),
        )
    except RECONNECT_ERRORS as exc:
        raise GatewayError(503, "bus_unavailable", f"the request queue is unreachable: {exc}") from exc
    log.debug(
        "chat_request", completion_id=submitted.completion_id, stream=bool(payload.stream),
        session_id=session_id, peer_user_id=auth.peer_user_id,
    )
    return submitted


# ------------------------------------------------------------------- the body


async def read_body_or_gone(request: Request, gw: Gateway) -> dict[str, Any] | None:
    """The body as a JSON object within the gateway's limits (hookbus.services.gateway.
    request_body), or None (the request marked as a 499) if the client left while sending it."""
    try:
        return await read_json_body(request, gw.limits, gw.body_timeout)
    except ClientDisconnect:
        request.state.final_status = 499
        return None


async def read_payload(request: Request, gw: Gateway, model: type[Body]) -> Body | None:
    """The body read and validated as `model` (a large one off the event loop); None if
    the client left while sending it."""
    body = await read_body_or_gone(request, gw)
    if body is None:
        return None
    return await off_loop(is_large_document(body), parse_body, body, model)


def parse_body(document: dict[str, Any], model: type[Body]) -> Body:
    """The body as `model`; a 400 that says what is wrong with it otherwise."""
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        raise invalid_body(exc) from None


def session_of(request: Request, payload: ChatCompletionRequest) -> str | None:
    """`X-Session-Id` if given, else the body's `user`."""
    header = request.headers.get("x-session-id")
    if header is not None:
        header = header.strip()
        if not header:
            raise GatewayError(400, "invalid_session_id", "X-Session-Id is empty", param="X-Session-Id")
        if len(header) > SESSION_ID_MAX:
            raise GatewayError(
                400, "invalid_session_id",
                f"X-Session-Id is longer than {SESSION_ID_MAX} characters", param="X-Session-Id",
            )
        return header
    return payload.user or None


# -------------------------------------------------------------- not streamed


async def final_completion(request: Request, gw: Gateway, submitted: RequestEnvelope) -> dict[str, Any] | None:
    """The run's final completion; None if the client left first (its run is cancelled)."""
    watcher = DisconnectWatcher(request.receive)
    try:
        item = await watcher.race(_terminal_item(gw, submitted))
    except ClientGone:
        await client_gone(request, gw, submitted.completion_id, CLIENT_DISCONNECTED)
        return None
    finally:
        await watcher.close()
    if item.kind == "final" and item.completion is not None:
        return item.completion
    if item.kind == "error":
        raise item_error(item)
    raise GatewayError(502, "bad_response", f"the request ended with {item.kind!r} and no completion")


async def _terminal_item(gw: Gateway, submitted: RequestEnvelope) -> ResponseItem:
    try:
        async with contextlib.aclosing(gw.client.items(submitted)) as items:  # type: ignore[type-var]
            async for item in items:
                if item.kind in ("final", "error", "done"):
                    return item
    except RECONNECT_ERRORS as exc:
        raise GatewayError(503, "bus_unavailable", f"lost the request queue: {exc}") from exc
    raise GatewayError(502, "bad_response", "the response stream ended without a completion")


# ------------------------------------------------------------------ streamed


class Relay:
    """The items of a streamed run after its first, up to the terminal one.

    Iterating gives the non-terminal items (chunks) in order and never raises: when it
    stops, `error` is None if the run ended well, else the run's error (or why its items
    could not be read on). `ended` is True once the terminal item (or that failure) came.
    """

    def __init__(self, watcher: DisconnectWatcher, first: ResponseItem, items: AsyncIterator[ResponseItem]) -> None:
        self.watcher = watcher
        self.first = first
        self._items = items
        self.ended = False
        self.error: HookbusError | None = None

    async def __aiter__(self) -> AsyncIterator[ResponseItem]:
        async with contextlib.aclosing(self._items):  # type: ignore[type-var]
            item: ResponseItem | None = self.first
            while item is not None:
                if item.kind == "error":
                    self._end(item_error(item))
                    return
                if item.kind in ("done", "final"):  # a streamed request gets no final completion
                    self._end(None)
                    return
                yield item
                try:
                    item = await anext(self._items)
                except StopAsyncIteration:
                    item = None
                except HookbusError as exc:  # deadline passed, unreadable item
                    self._end(exc)
                    return
                except RECONNECT_ERRORS as exc:
                    self._end(BusUnavailable(f"lost the request queue: {exc}"))
                    return
            self._end(ServiceError(502, "bad_response", "the response stream ended early"))

    def _end(self, error: HookbusError | None) -> None:
        self.ended = True
        self.error = error


async def open_stream(
    request: Request, gw: Gateway, submitted: RequestEnvelope, started: float
) -> Relay | None:
    """Wait for the run's first item before any header goes out, so that an error raised
    before it (a 402 in on_connection) is raised here, as a real HTTP error. None if the
    client left first (its run is cancelled)."""
    watcher = DisconnectWatcher(request.receive)
    items = gw.client.items(submitted)
    try:
        first = await watcher.race(_first_item(items))
    except ClientGone:
        await watcher.close()
        await client_gone(request, gw, submitted.completion_id, CLIENT_DISCONNECTED)
        return None
    except BaseException:
        await watcher.close()
        with contextlib.suppress(Exception):
            await items.aclose()  # type: ignore[attr-defined]
        raise
    if first.kind == "error":
        await watcher.close()
        await items.aclose()  # type: ignore[attr-defined]
        raise item_error(first)
    if first.kind == "chunk":
        gw.metrics.first_chunk.observe(time.perf_counter() - started)
    return Relay(watcher, first, items)


def relay_response(
    request: Request, gw: Gateway, completion_id: str, relay: Relay, frames: AsyncIterator[bytes]
) -> SSEResponse:
    """The SSE answer sending `frames` (made from `relay`); a client that leaves before the
    run ended gets its run cancelled."""

    async def on_gone(reason: str) -> None:
        if not relay.ended:
            await client_gone(request, gw, completion_id, reason)

    return SSEResponse(
        frames, relay.watcher, on_gone, headers={COMPLETION_ID_HEADER: completion_id}, stall_timeout=gw.stall_timeout
    )


async def _streamed(
    request: Request, gw: Gateway, submitted: RequestEnvelope, payload: ChatCompletionRequest,
    started: float,
) -> Response:
    relay = await open_stream(request, gw, submitted, started)
    if relay is None:
        return Response(status_code=499)
    frames = _frames(gw, relay, payload.include_usage)
    return relay_response(request, gw, submitted.completion_id, relay, frames)


async def _first_item(items: AsyncIterator[ResponseItem]) -> ResponseItem:
    try:
        return await anext(items)
    except StopAsyncIteration:
        raise GatewayError(502, "bad_response", "the response stream ended before its first item") from None
    except RECONNECT_ERRORS as exc:
        raise GatewayError(503, "bus_unavailable", f"lost the request queue: {exc}") from exc


async def _frames(gw: Gateway, relay: Relay, include_usage: bool) -> AsyncIterator[bytes]:
    """SSE frames of the run's chunks (progress as SSE comments); never raises: a failure
    becomes an error event."""
    async for item in relay:
        chunk = item.chunk
        if item.kind == "chunk" and chunk is not None and (chunk.get("choices") or include_usage):
            yield sse_event(chunk)
        elif item.kind == "progress":
            yield sse_comment(item.progress or "")
    if relay.error is not None:
        yield _error_frame(gw, relay.error)
    yield DONE


def item_error(item: ResponseItem) -> HookbusError:
    """The structured error of an `error` item (a 502 if the item carries none we can read)."""
    try:
        return HookbusError.from_dict(item.error or {})
    except (KeyError, TypeError, ValueError):
        return ServiceError(502, "bad_response", f"unreadable error item: {item.error!r}")


def _error_frame(gw: Gateway, error: HookbusError) -> bytes:
    gw.metrics.count_error(error)
    return sse_event(error_body(error))


async def client_gone(request: Request, gw: Gateway, completion_id: str, reason: str) -> None:
    request.state.final_status = 499
    gw.metrics.disconnects.inc()
    await request_cancel(gw.client.redis, gw.keys, completion_id, reason)
    if reason == CLIENT_STALLED:  # nobody will read it: what the run wrote goes now, not at its TTL
        with contextlib.suppress(*RECONNECT_ERRORS):
            await gw.client.redis.delete(gw.keys.responses(completion_id))
