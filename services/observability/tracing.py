"""OpenTelemetry tracing for hookbus processes: one trace per request, across every process.

Off unless the standard variables ask for it: `OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (OTLP, `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`
`http/protobuf` by default, `grpc` when its exporter package is installed), or
`OTEL_TRACES_EXPORTER=otlp|console`; `OTEL_SDK_DISABLED=true` or
`OTEL_TRACES_EXPORTER=none` turn it off whatever else is set. Everything else is the SDK's
own reading of the environment: `OTEL_SERVICE_NAME` (default by role: hookbus-gateway,
hookbus-orchestrator, hookbus-worker), `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER[_ARG]`,
`OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_BSP_*` (the batch span processor). The process's
instance name is the resource's `service.instance.id`.

Off, nothing here touches the SDK: each helper returns a shared do-nothing object whose
methods return at once, and envelopes carry no trace field. Message content (prompts,
completions, tool arguments and results) is recorded only with
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`.

The span tree of one request (names as exported):

    POST /v1/chat/completions          gateway, SERVER (continues a client's traceparent)
    └─ invoke_agent {agent}           orchestrator, CONSUMER (the RequestEnvelope's context)
       ├─ {lifecycle}                 one per stage that has hooks (on_chunk: one per chunk)
       │  ├─ hook {skill.method}      an in-process hook
       │  └─ hop {group}              CLIENT: the hop to a worker group
       │     └─ process {group}       worker, CONSUMER (the HopEvent's context)
       │        └─ hook {skill.method}
       ├─ chat {model}                CLIENT, GenAI inference span
       ├─ execute_tool {name}         GenAI tool span (a remote tool: hop/process below it)
       └─ compaction                  (its summary is a chat span below it)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import structlog
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, Tracer
from pydantic import BaseModel

from hookbus.bus.wire.tracecontext import TraceCarrier, incoming
from hookbus.skills.lifecycle import Lifecycle

if TYPE_CHECKING:  # the orchestrator imports this module
    from hookbus.services.orchestrator.serving.run_mode import RunMode

log = structlog.get_logger("hookbus.tracing")

ROLE_SERVICE_NAMES = {
    "gateway": "hookbus-gateway",
    "orchestrator": "hookbus-orchestrator",
    "worker": "hookbus-worker",
}
CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
PROVIDER = "openai"
"""gen_ai.provider.name (and the older gen_ai.system): hookbus speaks the OpenAI API."""

_TRUE = frozenset({"true", "1", "yes", "on"})


class TracingSettings(BaseModel):
    """What the environment asks for, read once when a process sets tracing up."""

    enabled: bool
    exporter: Literal["otlp", "console", "none"] = "none"
    protocol: str = "http/protobuf"
    capture_content: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> TracingSettings:
        def flag(name: str) -> bool:
            return environ.get(name, "").strip().lower() in _TRUE

        capture = flag(CAPTURE_CONTENT)
        named = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if flag("OTEL_SDK_DISABLED") or named == "none" or not (named or endpoint):
            return cls(enabled=False, capture_content=capture)
        exporter: Literal["otlp", "console"] = "console" if named == "console" else "otlp"
        protocol = (
            environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        ).strip().lower()
        return cls(enabled=True, exporter=exporter, protocol=protocol, capture_content=capture)


_tracer: Tracer | None = None
_capture = False
_provider: Any = None


def enabled() -> bool:
    return _tracer is not None


def configure_tracing(role: str, instance: str) -> bool:
    """Set up this process's tracer provider as its environment asks; True when tracing is on.

    Called once by each service command before it builds its service. The provider flushes
    its batch of spans when the process exits normally (SIGTERM included)."""
    global _tracer, _capture, _provider
    settings = TracingSettings.from_env(os.environ)
    _capture = settings.capture_content
    if not settings.enabled:
        return False
    exporter = _exporter(settings)
    if exporter is None:
        return False
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=_resource(role, instance))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _provider = provider
    _tracer = provider.get_tracer("hookbus")
    log.info(
        "tracing_enabled", role=role, instance=instance, exporter=settings.exporter,
        protocol=settings.protocol, capture_content=settings.capture_content,
    )
    return True


def shutdown_tracing() -> None:
    """Flush and stop (tests and embedders; services rely on the provider's exit hook)."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def _exporter(settings: TracingSettings) -> Any:
    if settings.exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if settings.protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            log.error(
                "tracing_disabled",
                reason="OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc; "
                "hookbus ships http/protobuf (use the collector's port 4318)",
            )
            return None
        return GrpcExporter()
    if settings.protocol != "http/protobuf":
        log.error("tracing_disabled", reason=f"unsupported OTLP protocol {settings.protocol!r}; use http/protobuf")
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _resource(role: str, instance: str) -> Any:
    """The role's service name and the instance id, unless the environment names them."""
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource

    from_env = OTELResourceDetector().detect().attributes
    defaults = {
        "service.name": ROLE_SERVICE_NAMES.get(role, f"hookbus-{role}"),
        "service.namespace": "hookbus",
        "service.instance.id": instance,
    }
    return Resource.create({k: v for k, v in defaults.items() if k not in from_env})


# ------------------------------------------------------------------ spans


def _ignore(*args: Any, **kwargs: Any) -> None:
    return None


class _Off:
    """The do-nothing stand-in every helper returns while tracing is off (one shared
    object): every method the span classes below offer, doing nothing."""

    __slots__ = ()
    carrier: TraceCarrier | None = None
    set = error = outcome = replied = failed = chunk = response = result = staticmethod(_ignore)

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


OFF: Any = _Off()


class Traced:
    """One span: entered, it is the current span (unless the class says `current = False`,
    for spans that live across an async generator's yields); an exception leaving it sets
    its status. Leaving it ends the span."""

    __slots__ = ("span", "_token")

    current = True

    def __init__(self, span: Any) -> None:
        self.span = span
        self._token: object | None = None

    @property
    def carrier(self) -> TraceCarrier | None:
        """This span's context for an envelope."""
        carrier: TraceCarrier = {}
        propagate.inject(carrier, context=trace.set_span_in_context(self.span))
        return carrier or None

    def __enter__(self) -> Traced:
        if self.current:
            self._token = otel_context.attach(trace.set_span_in_context(self.span))
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None and not isinstance(exc, GeneratorExit):
            self.error(exc)
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            self._token = None
        self.span.end()

    def set(self, **attributes: Any) -> None:
        for key, value in attributes.items():
            if value is not None:
                self.span.set_attribute(key.replace("__", "."), value)

    def error(self, exc: BaseException | str, error_type: str | None = None) -> None:
        """Mark the span failed: `error.type` and an ERROR status with the message."""
        if isinstance(exc, BaseException):
            code = getattr(exc, "code", None)
            error_type = error_type or (code if isinstance(code, str) else type(exc).__name__)
            message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            self.span.record_exception(exc)
        else:
            message = exc
        self.span.set_attribute("error.type", error_type or "error")
        self.span.set_status(Status(StatusCode.ERROR, str(message)[:500]))


def _start(
    name: str, kind: SpanKind = SpanKind.INTERNAL, *, parent: Any = None,
    links: Sequence[Link] = (), cls: type[Traced] = Traced, **attributes: Any,
) -> Any:
    """A started span wrapped in `cls`; `a__b` keyword names are the attributes `a.b`."""
    assert _tracer is not None
    span = _tracer.start_span(
        name, context=parent, kind=kind, links=links,
        attributes={k.replace("__", "."): v for k, v in attributes.items() if v is not None},
    )
    return cls(span)


# ------------------------------------------------------------- the gateway


TRACED_PATHS = frozenset({"/v1/chat/completions", "/v1/responses", "/v1/models"})
"""Paths whose requests get a server span; probes and scrapes (/healthz, /metrics) do not."""
TRACED_PREFIXES = {"/v1/models/": "/v1/models/{model}", "/v1/responses/": "/v1/responses/{response_id}"}
"""Routes with a path parameter: the span is named by the route, not the path."""


def _route(path: str) -> str | None:
    if path in TRACED_PATHS:
        return path
    return next((route for prefix, route in TRACED_PREFIXES.items() if path.startswith(prefix)), None)


class TracingMiddleware:
    """ASGI middleware: a SERVER span per API request, continuing the caller's `traceparent`."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        route = _route(path) if scope["type"] == "http" and _tracer is not None else None
        if route is None:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())}
        method = scope.get("method", "GET")
        server = _start(
            f"{method} {route}", SpanKind.SERVER, parent=propagate.extract(headers),
            http__request__method=method, url__path=path, http__route=route,
            url__scheme=scope.get("scheme", "http"),
            user_agent__original=headers.get("user-agent"),
        )
        status = 500

        async def send_traced(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                server.set(http__response__status_code=status)
            await send(message)

        with server:
            await self.app(scope, receive, send_traced)
            if status >= 500:
                server.error(f"HTTP {status}", str(status))


def gateway_middleware() -> list[Any]:
    """The gateway's tracing middleware, or none while tracing is off."""
    if _tracer is None:
        return []
    from starlette.middleware import Middleware

    return [Middleware(TracingMiddleware)]


# ------------------------------------------------------- the orchestrator


class RequestSpan(Traced):
    """`invoke_agent {agent}`: one request as this orchestrator runs it."""

    __slots__ = ()

    def outcome(self, kind: str, error: Mapping[str, Any] | None) -> None:
        """The request's terminal item: an `error` item fails the span."""
        if kind == "error" and error is not None:
            self.set(hookbus__status_code=error.get("status_code"))
            self.error(str(error.get("message", "")), str(error.get("code", "error")))


def request_span(
    agent_name: str, completion_id: str, carrier: TraceCarrier | None, mode: RunMode,
    *, session_id: str | None = None,
) -> Any:
    """A run continues the sender's trace; a request another orchestrator claimed after its
    first one was lost (`mode.recovering`) starts a trace of its own linked to it."""
    if _tracer is None:
        return OFF
    sender = incoming(carrier)
    links: list[Link] = []
    parent = sender
    if mode.recovering and sender is not None:
        linked = trace.get_current_span(sender).get_span_context()
        if linked.is_valid:
            links.append(Link(linked, {"hookbus.link": "first_run"}))
        parent = otel_context.Context()
    return _start(
        f"invoke_agent {agent_name}", SpanKind.CONSUMER, parent=parent, links=links,
        cls=RequestSpan, gen_ai__operation__name="invoke_agent", gen_ai__agent__name=agent_name,
        gen_ai__provider__name=PROVIDER, gen_ai__conversation__id=session_id,
        hookbus__completion_id=completion_id, hookbus__mode=mode, messaging__system="redis",
        messaging__operation__type="process",
    )


def stage_span(lifecycle: Lifecycle, stage_key: str) -> Any:
    """One lifecycle stage (every segment of its hook chain)."""
    if _tracer is None:
        return OFF
    return _start(lifecycle, hookbus__lifecycle=lifecycle, hookbus__stage_key=stage_key or lifecycle)


class HopSpan(Traced):
    """`hop {group}`: one hop, from sending it to applying its reply."""

    __slots__ = ()

    def replied(self, replica: str, failure: str | None, outcomes: Sequence[Any]) -> None:
        self.set(hookbus__replica=replica)
        bad = next((o for o in outcomes if o.outcome != "ok"), None)
        if failure:
            self.error(failure, "hop_failed")
        elif bad is not None:
            self.set(hookbus__hook_outcome=bad.outcome)

    def failed(self, reason: str, error_type: str) -> None:
        self.error(reason, error_type)


def hop_span(group: str, stream: str, lifecycle: str, hooks: Sequence[str], version: str | None = None) -> Any:
    """`hop {group}`: one hop sent and waited for; `version`: the group's version the
    request is pinned to (`hookbus.worker.version`; None for an unversioned group)."""
    if _tracer is None:
        return OFF
    return _start(
        f"hop {group}", SpanKind.CLIENT, cls=HopSpan, hookbus__group=group, hookbus__worker__version=version,
        hookbus__lifecycle=lifecycle, hookbus__hooks=list(hooks), messaging__system="redis",
        messaging__destination__name=stream, messaging__operation__type="send",
    )


def hook_observer() -> Any:
    """What `run_hooks(observe=...)` wraps each hook call in: a `hook {key}` span below the
    current (stage or process) span; None while off or when no span is being recorded."""
    if _tracer is None or not trace.get_current_span().is_recording():
        return None
    return _hook_span


def _hook_span(key: str, lifecycle: Lifecycle) -> Traced:
    return _start(f"hook {key}", hookbus__hook=key, hookbus__lifecycle=lifecycle)


class ChatSpan(Traced):
    """`chat {model}`: one LLM call (streamed or not), GenAI inference attributes."""

    __slots__ = ("_text", "_finish", "_chunked")
    current = False

    def __init__(self, span: Any) -> None:
        super().__init__(span)
        self._text: list[str] = []
        self._finish: list[str] = []
        self._chunked = False

    def chunk(self, chunk: Any) -> None:
        """A streamed chunk: model, id, finish reasons, usage and (opt-in) the text add up."""
        if not self._chunked:
            self._chunked = True
            self.set(gen_ai__response__id=chunk.id, gen_ai__response__model=chunk.model)
        for choice in chunk.choices or ():
            if choice.finish_reason:
                self._finish.append(choice.finish_reason)
            if _capture and choice.delta.content:
                self._text.append(choice.delta.content)
        if chunk.usage is not None:
            self._usage(chunk.usage)

    def response(self, completion: Any) -> None:
        """A whole completion (not streamed)."""
        self.set(gen_ai__response__id=completion.id, gen_ai__response__model=completion.model)
        self._finish = [c.finish_reason for c in completion.choices if c.finish_reason]
        if completion.usage is not None:
            self._usage(completion.usage)
        if _capture and completion.choices:
            self._text = [completion.choices[0].message.content or ""]

    def _usage(self, usage: Any) -> None:
        self.set(
            gen_ai__usage__input_tokens=usage.prompt_tokens,
            gen_ai__usage__output_tokens=usage.completion_tokens,
        )

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if self._finish:
            self.span.set_attribute("gen_ai.response.finish_reasons", self._finish)
        if _capture:
            output = {"role": "assistant", "parts": [{"type": "text", "content": "".join(self._text)}]}
            if self._finish:
                output["finish_reason"] = self._finish[0]
            self.span.set_attribute("gen_ai.output.messages", json.dumps([output]))
        super().__exit__(exc_type, exc, tb)


class Endpoint(Protocol):
    @property
    def base_url(self) -> str: ...


_REQUEST_SETTINGS = {
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "seed": "gen_ai.request.seed",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "stop": "gen_ai.request.stop_sequences",
}
"""The sampling fields of a call (ModelSettings) and their GenAI attribute names."""


def chat_span(
    model: str, endpoint: Endpoint, messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None, *, stream: bool, settings: Any = None,
) -> Any:
    """Not made current: a streamed call's span lives across its generator's yields.
    `endpoint.base_url` is read only while tracing is on; `settings` is the call's
    ModelSettings (its sampling fields become `gen_ai.request.*`)."""
    if _tracer is None:
        return OFF
    from urllib.parse import urlsplit

    url = urlsplit(endpoint.base_url)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.system": PROVIDER,
        "gen_ai.request.model": model,
        "gen_ai.request.stream": stream,
        "server.address": url.hostname or "",
        "server.port": url.port or (443 if url.scheme == "https" else 80),
    }
    for field, value in (settings.given() if settings is not None else {}).items():
        if field in _REQUEST_SETTINGS:
            attributes[_REQUEST_SETTINGS[field]] = [value] if isinstance(value, str) and field == "stop" else value
    if tools:
        attributes["gen_ai.request.tool_names"] = [str((t.get("function") or {}).get("name", "")) for t in tools]
    if _capture:
        attributes["gen_ai.input.messages"] = json.dumps([_message_parts(m) for m in messages])
    span = _tracer.start_span(f"chat {model}", kind=SpanKind.CLIENT, attributes=attributes)
    return ChatSpan(span)


def _message_parts(message: Mapping[str, Any]) -> dict[str, Any]:
    """One message in the GenAI conventions' parts form (text, tool calls, tool results)."""
    parts: list[dict[str, Any]] = []
    content = message.get("content")
    if message.get("role") == "tool":
        parts.append({"type": "tool_call_response", "id": message.get("tool_call_id"), "response": content})
    elif content:
        parts.append({"type": "text", "content": content if isinstance(content, str) else json.dumps(content)})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        parts.append({"type": "tool_call", "id": call.get("id"), "name": function.get("name"), "arguments": function.get("arguments")})
    return {"role": message.get("role"), "parts": parts}


class ToolSpan(Traced):
    """`execute_tool {name}`: one tool call, local or in a worker group."""

    __slots__ = ()

    def result(self, text: str, problem: BaseException | None = None) -> None:
        if problem is not None:
            self.error(problem, "tool_error")
        if _capture:
            self.set(gen_ai__tool__call__result=text)


def tool_span(name: str, call_id: str, arguments: Any) -> Any:
    if _tracer is None:
        return OFF
    return _start(
        f"execute_tool {name}", cls=ToolSpan, gen_ai__operation__name="execute_tool", gen_ai__tool__name=name,
        gen_ai__tool__call__id=call_id, gen_ai__tool__type="function",
        gen_ai__tool__call__arguments=(
            arguments if isinstance(arguments, str) else json.dumps(arguments)
        ) if _capture and arguments is not None else None,
    )


class CompactionSpan(Traced):
    """`compaction`: one compaction (its summary's LLM call is a chat span below it)."""

    __slots__ = ()

    def outcome(self, outcome: Any) -> None:
        self.set(
            hookbus__compaction__stage=outcome.stage, hookbus__compaction__before=outcome.before,
            hookbus__compaction__after=outcome.after, hookbus__compaction__window=outcome.window,
        )


def compaction_span(trigger: str) -> Any:
    if _tracer is None:
        return OFF
    return _start("compaction", cls=CompactionSpan, hookbus__compaction__trigger=trigger)


# ------------------------------------------------------------- the worker


def process_span(
    group: str, replica: str, lifecycle: str, carrier: TraceCarrier | None, attempt: int, version: str | None = None
) -> Any:
    """`process {group}`: a worker answering one hop, continuing the orchestrator's hop span
    (`version`: the version the replica runs its group at). A hop that carries no trace
    context (its orchestrator does not trace) gets no span: a worker continues traces, it
    never starts one per hop."""
    if _tracer is None or not carrier:
        return OFF
    return _start(
        f"process {group}", SpanKind.CONSUMER, parent=incoming(carrier), hookbus__group=group,
        hookbus__replica=replica, hookbus__worker__version=version, hookbus__lifecycle=lifecycle, hookbus__attempt=attempt,
        messaging__system="redis", messaging__operation__type="process",
    )


# ------------------------------------------------------------------- logs


def add_trace_ids(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: `trace_id` / `span_id` of the current span, so logs and traces join."""
    if _tracer is None:
        return event
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event.setdefault("trace_id", format(context.trace_id, "032x"))
        event.setdefault("span_id", format(context.span_id, "016x"))
    return event
