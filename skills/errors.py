"""Structured errors a hook raises to abort a request with an HTTP-style status."""

from __future__ import annotations

from typing import Any


class HookError(Exception):
    """Aborts the run: the client gets `status_code` and an OpenAI-style error body.

    `finalize_connection` still runs, with `data.error` set to this error.
    """

    def __init__(
        self,
        status_code: int,
        code: str,
        message: str,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        """The plain form that travels over the bus and rebuilds with `from_dict`."""
        return {
            "status_code": self.status_code,
            "code": self.code,
            "message": self.message,
            "details": self.details,
        }

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> HookError:
        if value.get("status_code") == 402:
            return PaymentRequired(value.get("message", "payment required"), value.get("details"))
        return cls(
            int(value["status_code"]),
            str(value.get("code", "error")),
            str(value.get("message", "")),
            value.get("details"),
        )

    def to_openai_body(self) -> dict[str, Any]:
        """The error body an OpenAI client expects: {"error": {message, type, code, param}}."""
        body: dict[str, Any] = {
            "message": self.message,
            "type": _error_type(self.status_code),
            "code": self.code,
            "param": None,
        }
        if self.details:
            body["details"] = self.details
        return {"error": body}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status_code}, {self.code!r}, {self.message!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HookError) and self.to_dict() == other.to_dict()

    __hash__ = Exception.__hash__


class PaymentRequired(HookError):
    """HTTP 402: the caller has no credit left; raise it from a billing hook."""

    def __init__(
        self, message: str = "payment required", details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(402, "payment_required", message, details)


def _error_type(status_code: int) -> str:
    if status_code in (401, 403):
        return "authentication_error"
    if status_code == 402:
        return "payment_required"
    if status_code == 429:
        return "rate_limit_error"
    if 400 <= status_code < 500:
        return "invalid_request_error"
    return "server_error"


def as_hook_error(exc: BaseException, status_code: int = 500, code: str = "internal_error") -> HookError:
    """Wrap anything that went wrong as the HookError finalize hooks and clients see."""
    if isinstance(exc, HookError):
        return exc
    message = str(exc) or type(exc).__name__
    return HookError(status_code, code, message, {"exception": type(exc).__name__})
