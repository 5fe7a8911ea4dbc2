"""OpenAI-style error responses: every error the gateway answers has the body
`{"error": {"message", "type", "code", "param"}}` (plus `details` when a hook gave some).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import structlog
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hookbus.skills import HookbusError, ServiceError

log = structlog.get_logger("hookbus.gateway")

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}
_STATUS_HEADERS = {
    401: {"WWW-Authenticate": "Bearer", "Connection": "close"},
    408: {"Connection": "close"},  # the rest of a late body would be read as the next request
    # a refused caller does not keep its connection for the next try: a flood of them would
    # hold the gateway's connections until their keep-alive ran out
    429: {"Connection": "close"},
    503: {"Connection": "close"},
}


class GatewayError(ServiceError):
    """An error the gateway itself raises (never a hook's); `param` names the offending request field."""

    def __init__(
        self, status_code: int, code: str, message: str, *, param: str | None = None
    ) -> None:
        super().__init__(status_code, code, message)
        self.param = param


def error_body(error: HookbusError) -> dict[str, object]:
    body = error.to_openai_body()
    param = getattr(error, "param", None) or (error.details or {}).get("param")
    if param is not None:
        body["error"]["param"] = param
    return body


def error_response(error: HookbusError, request: Request | None = None) -> JSONResponse:
    """The HTTP answer for a structured error; counts it in the error metric."""
    if request is not None:
        metrics = getattr(request.app.state, "metrics", None)
        if metrics is not None:
            metrics.count_error(error)
    if error.status_code >= 500:
        log.warning("gateway_error_response", status=error.status_code, code=error.code, message=error.message)
    headers = dict(_STATUS_HEADERS.get(error.status_code, {}))
    retry_after = (error.details or {}).get("retry_after")
    if retry_after is not None:  # an upstream 429's wait, kept for the client's own retry
        headers["Retry-After"] = str(retry_after)
    return JSONResponse(error_body(error), status_code=error.status_code, headers=headers or None)


def invalid_body(exc: ValidationError) -> GatewayError:
    """A 400 that says what is wrong with the body: each bad field and why."""
    problems = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        message = err["msg"].removeprefix("Value error, ")
        problems.append(f"{where}: {message}")
    first = exc.errors()[0] if exc.errors() else None
    param = ".".join(str(p) for p in first["loc"]) if first and first["loc"] else None
    missing = bool(first and first["type"] == "missing")
    return GatewayError(
        400,
        "missing_required_parameter" if missing else "invalid_value",
        "invalid request body: " + "; ".join(problems),
        param=param,
    )


async def on_hook_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HookbusError)
    return error_response(exc, request)


async def on_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404:
        message = f"no such endpoint: {request.method} {request.url.path}"
    response = error_response(GatewayError(exc.status_code, code, message), request)
    if exc.headers:
        response.headers.update(exc.headers)
    return response


async def on_unexpected(request: Request, exc: Exception) -> Response:
    log.error("gateway_error", path=request.url.path, error=repr(exc), exc_info=exc)
    return error_response(GatewayError(500, "internal_error", "the server failed: see its logs"), request)


ERROR_HANDLERS: Mapping[type[Exception], Callable[[Request, Exception], Awaitable[Response]]] = {
    HookbusError: on_hook_error,
    HTTPException: on_http_exception,
    Exception: on_unexpected,
}
"""How every hookbus HTTP app answers an error: the gateway and `hookbus console` both take
this map, so the console's refusals (401, 403, 404, 400) are the same in both and an
unexpected error is logged. Starlette picks the most specific class."""
