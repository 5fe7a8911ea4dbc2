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
- A client that disconnects before its answer ended gets its request cancelled
  (hookbus.services.gateway.cancel).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog
from pydantic import ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from hookbus.bus.connection import RECONNECT_ERRORS
from hookbus.bus.envelopes import RequestEnvelope, ResponseItem
from hookbus.services.gateway.cancel import request_cancel
from hookbus.services.gateway.errors import GatewayError, error_body, invalid_body
from hookbus.services.gateway.models import SESSION_ID_MAX, ChatCompletionRequest
from hookbus.services.gateway.sse import DONE, ClientGone, DisconnectWatcher, SSEResponse, sse_event
from hookbus.skills import HookError

if TYPE_CHECKING:
    from hookbus.services.gateway.app import Gateway

log = structlog.get_logger("hookbus.gateway")

COMPLETION_ID_HEADER = "x-hookbus-completion-id"
RESERVED_METADATA = frozenset({"completion_id", "model", "agent_name"})


def gateway_of(request: Request) -> Gateway:
    return request.app.state.gateway  # type: ignore[no-any-return]


async def chat_completions(request: Request) -> Response:
    gw = gateway_of(request)
    started = time.perf_counter()
    auth = gw.authenticate(request)
    try:
        body = await read_body(request, gw.max_body_bytes)
    except ClientDisconnect:
        request.state.final_status = 499
        return Response(status_code=499)
    payload = parse_request(body)
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
            payload.message_dicts(),
            stream=bool(payload.stream),
            session_id=session_id,
            auth=auth,
            metadata=metadata,
        )
    except RECONNECT_ERRORS as exc:
        raise GatewayError(503, "bus_unavailable", f"the request queue is unreachable: {exc}") from exc
    log.debug(
        "chat_request", completion_id=submitted.completion_id, stream=bool(payload.stream),
        session_id=session_id, peer_user_id=auth.peer_user_id,
    )
    if payload.stream:
        return await _streamed(request, gw, submitted, payload, started)
    return await _not_streamed(request, gw, submitted)


# ------------------------------------------------------------------- the body


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refusing more than `limit` bytes: by Content-Length first, then as read."""
    length = request.headers.get("content-length")
    if length is not None:
        try:
            declared = int(length)
        except ValueError:
            raise GatewayError(400, "invalid_content_length", "Content-Length is not a number") from None
        if declared > limit:
            raise _too_large(declared, limit)
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise _too_large(len(body), limit, at_least=True)
    return bytes(body)


def _too_large(size: int, limit: int, *, at_least: bool = False) -> GatewayError:
    more = "more than " if at_least else ""
    return GatewayError(
        413, "request_too_large",
        f"the request body is {more}{size} bytes; this gateway accepts at most {limit} bytes",
    )


def parse_request(body: bytes) -> ChatCompletionRequest:
    if not body.strip():
        raise GatewayError(400, "invalid_json", "the request has no body; send a JSON object")
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise GatewayError(400, "invalid_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise GatewayError(
            400, "invalid_json", f"the body must be a JSON object, not {type(payload).__name__}"
        )
    try:
        return ChatCompletionRequest.model_validate(payload)
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


async def _not_streamed(request: Request, gw: Gateway, submitted: RequestEnvelope) -> Response:
    watcher = DisconnectWatcher(request.receive)
    try:
        item = await watcher.race(_terminal_item(gw, submitted))
    except ClientGone:
        await _client_gone(request, gw, submitted.completion_id, "client_disconnected")
        return Response(status_code=499)
    finally:
        await watcher.close()
    if item.kind == "final" and item.completion is not None:
        return JSONResponse(item.completion, headers={COMPLETION_ID_HEADER: submitted.completion_id})
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


@dataclass
class _StreamState:
    completion_id: str
    include_usage: bool
    ended: bool = False
    chunks: int = 0


async def _streamed(
    request: Request, gw: Gateway, submitted: RequestEnvelope, payload: ChatCompletionRequest,
    started: float,
) -> Response:
    cid = submitted.completion_id
    watcher = DisconnectWatcher(request.receive)
    items = gw.client.items(submitted)
    try:
        first = await watcher.race(_first_item(items))
    except ClientGone:
        await watcher.close()
        await _client_gone(request, gw, cid, "client_disconnected")
        return Response(status_code=499)
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
    state = _StreamState(cid, payload.include_usage)

    async def on_gone(reason: str) -> None:
        if not state.ended:
            await _client_gone(request, gw, cid, reason)

    return SSEResponse(
        _frames(gw, state, first, items), watcher, on_gone, headers={COMPLETION_ID_HEADER: cid}
    )


async def _first_item(items: AsyncIterator[ResponseItem]) -> ResponseItem:
    try:
        return await anext(items)
    except StopAsyncIteration:
        raise GatewayError(502, "bad_response", "the response stream ended before its first item") from None
    except RECONNECT_ERRORS as exc:
        raise GatewayError(503, "bus_unavailable", f"lost the request queue: {exc}") from exc


async def _frames(
    gw: Gateway, state: _StreamState, first: ResponseItem, items: AsyncIterator[ResponseItem]
) -> AsyncIterator[bytes]:
    """SSE frames of the response items; never raises: a failure becomes an error event."""
    async with contextlib.aclosing(items):  # type: ignore[type-var]
        item: ResponseItem | None = first
        while item is not None:
            if item.kind == "chunk":
                chunk = item.chunk
                if chunk is not None and (chunk.get("choices") or state.include_usage):
                    state.chunks += 1
                    yield sse_event(chunk)
            elif item.kind == "error":
                state.ended = True
                yield _error_frame(gw, item_error(item))
                yield DONE
                return
            else:  # done (or a final completion, which a streamed request does not get)
                state.ended = True
                yield DONE
                return
            try:
                item = await anext(items)
            except StopAsyncIteration:
                item = None
            except HookError as exc:  # deadline passed, unreadable item
                state.ended = True
                yield _error_frame(gw, exc)
                yield DONE
                return
            except RECONNECT_ERRORS as exc:
                state.ended = True
                yield _error_frame(gw, HookError(503, "bus_unavailable", f"lost the request queue: {exc}"))
                yield DONE
                return
        state.ended = True
        yield _error_frame(gw, HookError(502, "bad_response", "the response stream ended early"))
        yield DONE


def item_error(item: ResponseItem) -> HookError:
    """The structured error of an `error` item (a 502 if the item carries none we can read)."""
    try:
        return HookError.from_dict(item.error or {})
    except (KeyError, TypeError, ValueError):
        return HookError(502, "bad_response", f"unreadable error item: {item.error!r}")


def _error_frame(gw: Gateway, error: HookError) -> bytes:
    gw.metrics.count_error(error)
    return sse_event(error_body(error))


async def _client_gone(request: Request, gw: Gateway, completion_id: str, reason: str) -> None:
    request.state.final_status = 499
    gw.metrics.disconnects.inc()
    await request_cancel(gw.client.redis, gw.keys, completion_id, reason)
