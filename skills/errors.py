"""hookbus's errors: the structured error with an HTTP-style status that ends a request, in
two branches under `HookbusError`:

- `HookError` (and `PaymentRequired`, `GuardUnavailable`): a hook's verdict. A hook raises
  it to abort the run; the runner raises it on a hook's behalf (a critical hook that failed,
  a guard that could not answer).
- `ServiceError` (`Cancelled`, `DeadlineExceeded`, `BusUnavailable`, `UpstreamError`, ...):
  what went wrong around the hooks, raised by hookbus itself, never by a hook.

So `except HookError` in a skill catches hook errors only: a bus outage or a cancellation
reaching a hook's own code (a hook that sends a request through `HookbusClient`, say) is not
taken for another hook's verdict. `except HookbusError` catches both; the client sees the
same status, code and body either way.

Each error's class travels with it over the bus (`to_dict()["type"]`), so a client or a
worker gets the same subclass back from `HookbusError.from_dict` (an unknown or missing type
rebuilds as a plain `HookError`, or `PaymentRequired` for a 402).
"""

from __future__ import annotations

from typing import Any


class HookbusError(Exception):
    """Ends the run: the client gets `status_code` and an OpenAI-style error body.

    `finalize_connection` still runs, with `data.error` set to this error. Raise one of its
    two branches, never this class itself: `HookError` from a hook, `ServiceError` from
    hookbus's own code.
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
            "type": _wire_type(self),
            "status_code": self.status_code,
            "code": self.code,
            "message": self.message,
            "details": self.details,
        }

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> HookbusError:
        """The error `to_dict` described, as its own class when it is one of hookbus's."""
        kind = _KINDS.get(str(value.get("type")))
        if kind is None:
            kind = PaymentRequired if value.get("status_code") == 402 else HookError
        error = Exception.__new__(kind)
        HookbusError.__init__(
            error,
            int(value["status_code"]),
            str(value.get("code", "error")),
            str(value.get("message", "")),
            value.get("details"),
        )
        return error

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
        """Same status, code, message and details (whatever the class that carries them)."""
        if not isinstance(other, HookbusError):
            return False
        mine, theirs = self.to_dict(), other.to_dict()
        del mine["type"], theirs["type"]
        return mine == theirs

    __hash__ = Exception.__hash__


class HookError(HookbusError):
    """A hook's verdict: raised by a hook, it aborts the run (in `finalize_connection` it is
    logged and the other hooks still run). What `except HookError` catches: hook errors only,
    never a failure of hookbus itself (see `ServiceError`)."""


class ServiceError(HookbusError):
    """Something went wrong around the hooks: the client cancelled, the deadline passed, the
    bus or the LLM endpoint failed, the orchestrator was lost. Raised by hookbus, never by a
    hook; a hook whose own code meets one (it called a client that lost the bus) has failed
    like a hook that raised any other exception, it has not aborted the run."""


class PaymentRequired(HookError):
    """HTTP 402: the caller has no credit left; raise it from a billing hook."""

    def __init__(
        self, message: str = "payment required", details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(402, "payment_required", message, details)


class Cancelled(ServiceError):
    """499: the client cancelled the request or stopped reading (`code` says which)."""

    def __init__(self, message: str = "the request was cancelled", code: str = "cancelled") -> None:
        super().__init__(499, code, message)


class DeadlineExceeded(ServiceError):
    """504: the request did not finish before its deadline."""

    def __init__(self, message: str = "the request did not finish before its deadline") -> None:
        super().__init__(504, "deadline_exceeded", message)


class BusUnavailable(ServiceError):
    """503: Redis (the request queue or a response stream) could not be reached."""

    def __init__(self, message: str) -> None:
        super().__init__(503, "bus_unavailable", message)


class RedisOutOfMemory(ServiceError):
    """503: Redis is at maxmemory (policy noeviction): nothing can be queued."""

    def __init__(
        self,
        message: str = (
            "Redis is out of memory (maxmemory reached, policy noeviction): no request can be "
            "queued until memory is freed or maxmemory raised"
        ),
    ) -> None:
        super().__init__(503, "redis_out_of_memory", message)


class GuardUnavailable(HookError):
    """503: a guard hook (`@hook(..., guard=True)`) could not give its verdict, so the
    request was refused rather than let through unchecked."""

    def __init__(self, hook_key: str, reason: str) -> None:
        super().__init__(503, "guard_unavailable", f"the guard {hook_key} could not check this request: {reason}")


class OrchestratorLost(ServiceError):
    """503: the orchestrator running the request stopped; another one finalized it."""

    def __init__(
        self,
        message: str = (
            "the orchestrator running this request stopped; the run was lost and has been "
            "finalized by another orchestrator. Retry the request."
        ),
    ) -> None:
        super().__init__(503, "orchestrator_lost", message)


class DuplicateCompletionId(ServiceError):
    """409: another request already uses this completion id."""

    def __init__(self, completion_id: str) -> None:
        super().__init__(409, "duplicate_completion_id", f"completion id {completion_id!r} is already in use")


class ContextTooLong(ServiceError):
    """400: the endpoint refused the prompt as longer than the model's context window."""

    def __init__(self, message: str) -> None:
        super().__init__(400, "context_length_exceeded", message)


class UpstreamError(ServiceError):
    """The LLM endpoint failed: it answered an error (502, or 404 for an unknown model, with
    its own code), timed out (504) or could not be reached (502)."""


_KINDS: dict[str, type[HookbusError]] = {
    kind.__name__: kind
    for kind in (
        HookbusError, HookError, ServiceError, PaymentRequired, Cancelled, DeadlineExceeded, BusUnavailable,
        RedisOutOfMemory, GuardUnavailable,
        OrchestratorLost, DuplicateCompletionId, ContextTooLong, UpstreamError,
    )
}
"""The classes an error may come back as from the bus; never a class named by the sender."""


def _wire_type(error: HookbusError) -> str:
    """The nearest of hookbus's own classes (a skill's subclass travels as its hookbus base)."""
    return next(k.__name__ for k in type(error).__mro__ if k.__name__ in _KINDS and _KINDS[k.__name__] is k)


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


def as_hookbus_error(
    exc: BaseException, status_code: int = 500, code: str = "internal_error"
) -> HookbusError:
    """Wrap anything that went wrong as the structured error finalize hooks and clients see:
    in words, with no Python class name or text in it (those are for the log, which the
    caller writes with the exception); a plain exception in hookbus's own code becomes a
    `ServiceError`."""
    if isinstance(exc, HookbusError):
        return exc
    return ServiceError(status_code, code, "the request failed inside hookbus; its log has the cause")
