"""The endpoint's errors as the client should see them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
import openai

from hookbus.skills.errors import ContextTooLong, ServiceError, UpstreamError

CAUSES_LOOKED_AT = 8
"""How deep `timed_out` follows an error's causes (the transport's chain is 2-3 long)."""

_STATUS_SEEN = {400: 400, 404: 404, 408: 504, 413: 400, 422: 400, 429: 429, 503: 503, 504: 504}
"""Upstream status -> the client's; every other 4xx (401, 403: the operator's key) and 5xx
is a 502, the endpoint having failed us."""



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
