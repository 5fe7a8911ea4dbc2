"""A recording hop between hookbus and the model server, for `make check-real-model`.

A case that fails through hookbus is the model's only if the model fails the very request
hookbus sent it; a twin the check builds itself (the bare question) is another request, so
it cannot say whose a failure is. hookbus's `OPENAI_BASE_URL` points here: every chat
request passes on byte for byte, its answer comes back chunk by chunk as the server sends
it (a stream stays a stream), and both are kept, so the check can replay a failing call's
exact body straight to the server. Nothing in hookbus or its client is patched.
"""

from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PASSED_HEADERS = ("Content-Type", "Authorization", "Accept")
RECORDED_PATH = "/chat/completions"


@dataclass(frozen=True)
class Exchange:
    """One chat request hookbus made upstream and the server's answer to it, as sent."""

    path: str
    body: bytes
    status: int
    answer: bytes


class RecordingProxy:
    """Forwards every request to the server on `upstream_port` and records the chat ones."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name="recording-proxy", daemon=True).start()

    def mark(self) -> int:
        """Where the next case's exchanges start."""
        with self._lock:
            return len(self._exchanges)

    def since(self, mark: int) -> list[Exchange]:
        with self._lock:
            return self._exchanges[mark:]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _record(self, exchange: Exchange) -> None:
        with self._lock:
            self._exchanges.append(exchange)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Forward(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - the http.server hook's name
                self._forward(b"")

            def do_POST(self) -> None:  # noqa: N802 - the http.server hook's name
                self._forward(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

            def _forward(self, body: bytes) -> None:
                """Relays the answer as it comes and records the exchange before the stream's
                last chunk, so a client that saw the end finds it recorded; a client that
                hangs up ends the relay, and what the server had answered by then is
                recorded."""
                upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=900)
                received, status, recorded = bytearray(), 0, False

                def record() -> None:
                    if self.command == "POST" and self.path.endswith(RECORDED_PATH):
                        proxy._record(Exchange(self.path, body, status, bytes(received)))

                try:
                    headers = {name: self.headers[name] for name in PASSED_HEADERS if self.headers[name]}
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    status = answer.status
                    self.send_response(status)
                    self.send_header("Content-Type", answer.getheader("Content-Type") or "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    while piece := answer.read1(65536):
                        received += piece
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                        self.wfile.flush()
                    record()
                    recorded = True
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    self.close_connection = True
                finally:
                    upstream.close()
                    if not recorded:
                        record()

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
                """Quiet: the check prints its own lines."""

        return Forward
