"""What one request may hold, defined once for the gateway and the orchestrator.

A request's cost is not its byte size: 4 MiB of 123,000 one-word messages took an
orchestrator 80 s of event-loop time, while 4 MiB of one long message costs almost
nothing. So a request is bounded in bytes, in messages, in bytes per message, in JSON
values and in nesting depth, and both edges of the bus check the same limits with the
same parser (pydantic's, which the orchestrator's envelope decoding uses), so a body the
gateway lets through never fails the orchestrator's decoding:

    limits = RequestLimits()
    document = parse_json(body, limits)      # 413 / 400 LimitExceeded, 400 InvalidJSON
    check_document(document, limits)         # messages, values, depth

The orchestrator checks the envelope with `limits.for_envelope()`: the same limits plus
what the envelope adds around the caller's body (its own fields, one level of nesting for
the model settings).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field

from hookbus.skills import ServiceError

MAX_REQUEST_BYTES = 4 * 1024 * 1024
"""The largest request body (gateway) and request envelope payload (bus), in bytes."""

ENVELOPE_BYTES = 64 * 1024
ENVELOPE_DEPTH = 2
ENVELOPE_VALUES = 4096

CONVERSATION_FIELDS = ("messages", "input")
"""Where a request's conversation is: Chat Completions `messages`, Responses API `input`."""

_PARSER_DEPTH = 200
"""pydantic's JSON parser refuses deeper documents ("recursion limit exceeded")."""


class RequestLimits(BaseModel):
    """Bounds on one request; every field is a knob of `hookbus gateway` and `orchestrator`."""

    model_config = ConfigDict(frozen=True)

    max_request_bytes: int = Field(default=MAX_REQUEST_BYTES, gt=0, description="Bytes in the whole body.")
    max_messages: int = Field(default=2048, gt=0, description="Messages in `messages`.")
    max_message_bytes: int = Field(
        default=1024 * 1024, gt=0, description="Bytes of one message as compact JSON."
    )
    max_values: int = Field(
        default=50_000, gt=0, description="JSON values (objects, arrays, strings, numbers...) in the body."
    )
    max_depth: int = Field(
        default=64, gt=0, lt=_PARSER_DEPTH - ENVELOPE_DEPTH, description="Nesting of arrays and objects."
    )

    def for_envelope(self) -> RequestLimits:
        """The limits a request envelope on the bus is held to: room for what wraps the body."""
        return self.model_copy(
            update={
                "max_request_bytes": self.max_request_bytes + ENVELOPE_BYTES,
                "max_values": self.max_values + ENVELOPE_VALUES,
                "max_depth": self.max_depth + ENVELOPE_DEPTH,
            }
        )


class LimitExceeded(ServiceError):
    """A request over one of its limits; `param` names the field, as OpenAI's errors do."""

    def __init__(self, status_code: int, code: str, message: str, *, param: str | None = None) -> None:
        super().__init__(status_code, code, message)
        self.param = param


class InvalidJSON(ServiceError):
    def __init__(self, message: str) -> None:
        super().__init__(400, "invalid_json", message)
        self.param: str | None = None


def parse_json(raw: bytes, limits: RequestLimits) -> Any:
    """The document in `raw`, with pydantic's parser (no lone surrogates, depth under 200)."""
    if len(raw) > limits.max_request_bytes:
        raise too_large(len(raw), limits.max_request_bytes)
    try:
        return pydantic_core.from_json(raw, cache_strings="keys")
    except ValueError as exc:
        if "recursion limit" in str(exc):
            raise too_deep(limits.max_depth) from None
        raise InvalidJSON(f"the body is not valid JSON: {exc}") from None


def too_large(size: int, limit: int, *, at_least: bool = False) -> LimitExceeded:
    more = "more than " if at_least else ""
    return LimitExceeded(
        413, "request_too_large", f"the request body is {more}{size} bytes; the limit is {limit} bytes"
    )


def too_deep(limit: int) -> LimitExceeded:
    return LimitExceeded(
        400, "too_deeply_nested", f"the request nests arrays and objects more than {limit} levels deep"
    )


def check_document(document: Any, limits: RequestLimits) -> None:
    """Refuse a parsed request over its limits; its shape is left to the request model."""
    if not isinstance(document, dict):
        return
    for field in CONVERSATION_FIELDS:
        messages = document.get(field)
        if isinstance(messages, list):
            check_messages(messages, limits, field)
    check_shape(document, limits)


def check_messages(messages: Sequence[Any], limits: RequestLimits, field: str = "messages") -> None:
    """At most `max_messages` messages, each at most `max_message_bytes` as compact JSON."""
    if len(messages) > limits.max_messages:
        raise LimitExceeded(
            400, "too_many_messages",
            f"the request has {len(messages)} {field}; the limit is {limits.max_messages}",
            param=field,
        )
    for index, message in enumerate(messages):
        size = len(pydantic_core.to_json(message))
        if size > limits.max_message_bytes:
            raise LimitExceeded(
                413, "message_too_large",
                f"{field} item {index} is {size} bytes; the limit is {limits.max_message_bytes} bytes per message",
                param=f"{field}.{index}",
            )


def check_shape(document: Any, limits: RequestLimits) -> None:
    """At most `max_values` JSON values and `max_depth` levels; stops as soon as either is over.

    Iterative, so a deep document cannot exhaust the Python stack, and bounded: it never
    looks at more than `max_values` values whatever the body holds."""
    stack: list[tuple[Any, int]] = [(document, 1)]
    values = 1
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limits.max_depth:
            raise too_deep(limits.max_depth)
        values += len(children)
        if values > limits.max_values:
            raise LimitExceeded(
                400, "too_many_values", f"the request holds more than {limits.max_values} JSON values"
            )
        stack.extend((child, depth + 1) for child in children)


def over_hop_limits(hop_bytes: int, state_bytes: int | None, max_hop_bytes: int, max_state_bytes: int) -> str | None:
    """Why a hop's payload may not travel (None when it may): over the bytes one hop may
    carry (HOOKBUS_MAX_HOP_BYTES) or the bytes of ctx.state a request carries from hop to
    hop (HOOKBUS_MAX_STATE_BYTES). Large payloads stay in Redis (a hop, its reply) until
    trimmed; these bound what one request can put there. `state_bytes` None: not known."""
    if state_bytes is not None and state_bytes > max_state_bytes:
        return (
            f"ctx.state is {state_bytes:,} bytes as JSON, over its limit of {max_state_bytes:,} "
            "(HOOKBUS_MAX_STATE_BYTES): keep large data elsewhere and put a key in the state"
        )
    if hop_bytes > max_hop_bytes:
        return (
            f"the hooks' results are {hop_bytes:,} bytes, over a hop's limit of {max_hop_bytes:,} "
            "(HOOKBUS_MAX_HOP_BYTES)"
        )
    return None
