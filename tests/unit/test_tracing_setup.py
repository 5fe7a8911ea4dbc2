"""Tracing is off unless the standard OTEL_* variables ask for it, and off it costs a hop
nothing: no SDK object, no trace field on the wire."""

from __future__ import annotations

import time

import pytest

from hookbus.bus.wire import tracecontext
from hookbus.bus.wire.envelopes import HopEvent, RequestEnvelope, encode, encode_hop
from hookbus.services.observability import tracing
from hookbus.services.observability.tracing import TracingSettings, configure_tracing
from hookbus.services.orchestrator.serving import RunMode

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}


@pytest.mark.parametrize(
    ("environ", "on", "protocol"),
    [
        ({}, False, None),
        ({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, False, None),
        (ENDPOINT, True, "http/protobuf"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True, "http/protobuf"),
        ({**ENDPOINT, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, True, "grpc"),
        ({**ENDPOINT, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, True, "http/protobuf"),
        ({"OTEL_TRACES_EXPORTER": "console"}, True, "http/protobuf"),
        ({**ENDPOINT, "OTEL_SDK_DISABLED": "true"}, False, None),
        ({**ENDPOINT, "OTEL_TRACES_EXPORTER": "none"}, False, None),
    ],
)
def test_the_standard_variables_turn_tracing_on_and_off(environ, on, protocol):
    settings = TracingSettings.from_env(environ)
    assert settings.enabled is on
    if on:
        assert settings.protocol == protocol


def test_content_capture_is_off_unless_opted_in():
    assert TracingSettings.from_env(ENDPOINT).capture_content is False
    opted = {**ENDPOINT, "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}
    assert TracingSettings.from_env(opted).capture_content is True


def test_a_protocol_hookbus_cannot_speak_leaves_tracing_off(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    assert configure_tracing("worker", "w-1") is False
    assert not tracing.enabled()
    try:
        import opentelemetry.exporter.otlp.proto.grpc  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        assert configure_tracing("worker", "w-1") is False
        assert not tracing.enabled()


def test_the_service_is_named_by_role_unless_the_environment_names_it(monkeypatch):
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    resource = tracing._resource("orchestrator", "orch-7").attributes
    assert resource["service.name"] == "hookbus-orchestrator"
    assert resource["service.instance.id"] == "orch-7"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "billing-agent")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=pod-3,deployment.environment=prod")
    resource = tracing._resource("orchestrator", "orch-7").attributes
    assert resource["service.name"] == "billing-agent"
    assert resource["service.instance.id"] == "pod-3"
    assert resource["deployment.environment"] == "prod"


def test_off_every_helper_is_the_shared_do_nothing_object_and_envelopes_carry_no_trace():
    assert not tracing.enabled()
    helpers = [
        tracing.hop_span("g", "s", "on_chunk", ["a.b"]),
        tracing.stage_span("on_chunk", "on_chunk#1"),
        tracing.process_span("g", "r", "on_chunk", None, 1),
        tracing.request_span("agent", "cid", None, RunMode.RUN),
        tracing.tool_span("t", "call_1", "{}"),
        tracing.compaction_span("in_run"),
        tracing.chat_span("m", object(), [], None, stream=True),  # type: ignore[arg-type]
    ]
    assert all(h is tracing.OFF for h in helpers)
    assert tracing.hook_observer() is None and tracing.gateway_middleware() == []
    with tracing.hop_span("g", "s", "on_chunk", []) as span:
        assert span.carrier is None
        span.replied("r", None, [])
    assert tracecontext.outgoing() is None
    event = HopEvent(hop_id="h", completion_id="c", lifecycle="on_chunk", stage_key="k", ctx={}, reply_to="r", deadline=1.0)
    assert b"trace" not in encode_hop(event, b"{}", b"{}")[b"e"]
    assert b"trace" not in encode(RequestEnvelope(completion_id="c", messages=[{"role": "user", "content": "x"}]))[b"e"]


def test_off_the_tracing_calls_of_one_hop_cost_well_under_a_microsecond_each():
    """What BusRuntime.hop and the worker call per hop while tracing is off, timed."""
    rounds = 20000
    started = time.perf_counter()
    for _ in range(rounds):
        with tracing.stage_span("on_chunk", "on_chunk#1"), tracing.hop_span("g", "s", "on_chunk", ()) as hop:
            _ = hop.carrier
            hop.replied("r", None, ())
        with tracing.process_span("g", "r", "on_chunk", None, 1):
            pass
        tracing.hook_observer()
    per_hop_us = (time.perf_counter() - started) / rounds * 1e6
    assert per_hop_us < 20, f"{per_hop_us:.2f} us of tracing calls per hop while off"
