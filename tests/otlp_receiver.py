"""A real OTLP/HTTP trace receiver for tests and benchmarks: what a collector would get.

    with OtlpReceiver() as receiver:          # http://127.0.0.1:PORT, POST /v1/traces
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.url
        ...
        spans = receiver.spans(trace_id)      # decoded from the protobuf ExportTraceServiceRequest

It decodes each request body (`application/x-protobuf`, gzip or not) with the official
opentelemetry-proto messages and keeps every span as a `ReceivedSpan`, with its
resource's attributes (service.name, service.instance.id). It answers as a collector does
(an ExportTraceServiceResponse); a body it cannot decode gets a 400 and is counted in
`bad_requests`.
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}


@dataclass
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status: str
    status_message: str
    start_ns: int
    end_ns: int
    links: list[tuple[str, str]] = field(default_factory=list)

    @property
    def service(self) -> str:
        return str(self.resource.get("service.name", ""))


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, which) if which else None


def decode_spans(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        name=span.name,
                        kind=KINDS.get(span.kind, str(span.kind)),
                        attributes={kv.key: _value(kv.value) for kv in span.attributes},
                        resource=resource,
                        status=STATUS.get(span.status.code, str(span.status.code)),
                        status_message=span.status.message,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                    )
                )
    return spans


class OtlpReceiver:
    def __init__(self, port: int = 0) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.requests = 0
        self.bad_requests = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = self._body()
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                try:
                    if self.path != "/v1/traces":
                        raise DecodeError(f"no such path {self.path}")
                    spans = decode_spans(body)
                except DecodeError:
                    with receiver._lock:
                        receiver.bad_requests += 1
                    self.send_response(400)
                    self.end_headers()
                    return
                with receiver._lock:
                    receiver.requests += 1
                    receiver._spans.extend(spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def _body(self) -> bytes:
                """The request's body, sized or chunked (Node's OTLP exporter streams it)."""
                if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                    return self.rfile.read(int(self.headers.get("Content-Length") or 0))
                parts = []
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
                self.rfile.readline()
                return b"".join(parts)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def spans(self, trace_id: str | None = None) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self._spans if trace_id is None or s.trace_id == trace_id]

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()


def main() -> None:
    """`python -m tests.otlp_receiver PORT`: serve until SIGTERM, then print the span count
    (benchmarks run the receiver in a process of its own, so decoding costs them nothing)."""
    import signal
    import sys

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with OtlpReceiver(port=int(sys.argv[1])) as receiver:
        print(f"listening {receiver.url}", flush=True)
        stop.wait()
        print(f"spans {len(receiver.spans())} requests {receiver.requests} bad {receiver.bad_requests}", flush=True)


if __name__ == "__main__":
    main()
