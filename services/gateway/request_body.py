"""Reading a request body at the edge: bounded in bytes and in time, parsed within limits.

Every route that takes a JSON body calls `read_json_body`; it answers with the structured
error a client can act on, never a 500:

- over `limits.max_request_bytes` -> 413, by Content-Length before anything is read, else as read;
- slower than `body_timeout` seconds for the whole body (a client dripping bytes) -> 408;
- not JSON, a lone surrogate, not an object -> 400 `invalid_json`;
- too many messages, values or levels -> 400, a message over its size -> 413
  (hookbus.bus.limits, the same checks the orchestrator makes).
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request

from hookbus.bus.limits import (
    CONVERSATION_FIELDS,
    InvalidJSON,
    RequestLimits,
    check_document,
    parse_json,
    too_large,
)
from hookbus.services.gateway.errors import GatewayError
from hookbus.services.process.offload import is_large, off_loop


async def read_json_body(request: Request, limits: RequestLimits, body_timeout: float) -> dict[str, Any]:
    """The body as a JSON object that passed `limits`; raises the GatewayError to answer with.

    A client that goes away while sending raises starlette's ClientDisconnect."""
    raw = await read_body(request, limits.max_request_bytes, body_timeout)
    return await off_loop(is_large(size=len(raw)), parse_within, raw, limits)


def parse_within(raw: bytes, limits: RequestLimits) -> dict[str, Any]:
    """The body as a JSON object that passed `limits` (CPU work: off the loop when large)."""
    if not raw.strip():
        raise InvalidJSON("the request has no body; send a JSON object")
    document = parse_json(raw, limits)
    if not isinstance(document, dict):
        raise InvalidJSON(f"the body must be a JSON object, not {_json_type(document)}")
    check_document(document, limits)
    return document


def is_large_document(document: dict[str, Any]) -> bool:
    """Whether validating this body is worth a trip to the offload pool."""
    conversation = [document.get(field) for field in CONVERSATION_FIELDS]
    return any(isinstance(c, list) and is_large(c) for c in conversation)


async def read_body(request: Request, limit: int, body_timeout: float) -> bytes:
    """The body, refusing more than `limit` bytes or more than `body_timeout` seconds."""
    length = request.headers.get("content-length")
    if length is not None:
        try:
            declared = int(length)
        except ValueError:
            raise GatewayError(400, "invalid_content_length", "Content-Length is not a number") from None
        if declared > limit:
            raise too_large(declared, limit)
    body = bytearray()
    try:
        async with asyncio.timeout(body_timeout):
            async for piece in request.stream():
                body += piece
                if len(body) > limit:
                    raise too_large(len(body), limit, at_least=True)
    except TimeoutError:
        raise GatewayError(
            408, "request_timeout",
            f"the request body did not arrive within {body_timeout:g} s ({len(body)} bytes came)",
        ) from None
    return bytes(body)


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")
