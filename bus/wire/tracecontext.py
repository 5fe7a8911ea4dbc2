"""W3C trace context on the bus: what a sender puts in an envelope, and what a receiver
continues from.

Only the OpenTelemetry API is used here (never the SDK): with no tracer provider set up,
no span is ever current and `outgoing()` returns None at the cost of one context lookup,
so an envelope carries no trace field at all. Any process that sets up OpenTelemetry
(hookbus's own services through hookbus.services.observability.tracing, or an application of its own
around a HookbusClient) gets its active trace carried to the orchestrator and the workers.
"""

from __future__ import annotations

from opentelemetry import propagate, trace
from opentelemetry.context import Context

TraceCarrier = dict[str, str]
"""The propagator's fields (`traceparent`, `tracestate`, `baggage`) as they travel."""


def outgoing() -> TraceCarrier | None:
    """The current span's context for an envelope; None when no span is being recorded."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: TraceCarrier = {}
    propagate.inject(carrier)
    return carrier or None


def incoming(carrier: TraceCarrier | None) -> Context | None:
    """The sender's context to continue from (None: start a new trace)."""
    if not carrier:
        return None
    return propagate.extract(carrier)


def tag_current_span(key: str, value: str) -> None:
    """Set one attribute on the caller's span, if it records one (a no-op otherwise)."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute(key, value)
