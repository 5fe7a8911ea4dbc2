"""A recording upstream: a real HTTP server that plays an OpenAI-compatible endpoint.

It records every request it receives (method, path, body) and answers from a script (a
queue of scripted answers, FIFO), else by its `rule` (an answer decided by the request's
body), else with a plain completion / stream. Tests use it to prove what reaches the model
(each parameter, the message form) and how each upstream error maps.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_TEXT = "upstream says hi"


@dataclass
class Reply:
    """A JSON answer (a completion or an error body) with its status and headers."""

    body: dict[str, Any]
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class Stream:
    """An SSE answer: these chunk dicts, then `data: [DONE]` (unless `done` is False)."""

    chunks: list[dict[str, Any]]
    done: bool = True


@dataclass
class Raw:
    """Bytes as they are, with this status and content type, then the connection closes: an
    upstream that sends what no OpenAI endpoint should (HTML, a broken SSE line)."""

    body: bytes
    content_type: str = "application/json"
    status: int = 200


Answer = Reply | Stream | Raw


@dataclass(frozen=True)
class Seen:
    """One request as it arrived (`body`: its JSON, None for a GET)."""

    method: str
    path: str
    body: dict[str, Any] | None


def completion(text: str | None = DEFAULT_TEXT, tool_calls: list[dict[str, Any]] | None = None,
               usage: bool = True) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    body: dict[str, Any] = {
        "id": "chatcmpl-upstream", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if tool_calls else "stop"}],
    }
    if usage:
        body["usage"] = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    return body


def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-upstream", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}


def text_stream(text: str = DEFAULT_TEXT, usage: bool = True) -> Stream:
    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": word}) for word in _words(text)]
    chunks.append(chunk({}, "stop"))
    if usage:
        chunks.append({**chunk({}), "choices": [],
                       "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})
    return Stream(chunks)


def error(status: int, message: str, code: str | None, *, param: str | None = None,
          headers: dict[str, str] | None = None, delay: float = 0.0) -> Reply:
    body = {"error": {"message": message, "type": "upstream_error", "code": code, "param": param}}
    return Reply(body, status, headers or {}, delay)


def _words(text: str) -> Iterator[str]:
    for i, word in enumerate(text.split(" ")):
        yield word if i == 0 else " " + word


Rule = Callable[[dict[str, Any]], Answer | None]
"""Decides the answer to a chat request's body (None: the default answer)."""


def silent(stream: bool, text: str = "") -> Answer:
    """An answer with no tool call and no text (or `text`: a tool-call marker), finish_reason
    stop, streamed (the role delta, the text in pieces, the finish) or not."""
    if not stream:
        return Reply(completion(text))
    pieces = [chunk({"content": text[i:i + 4]}) for i in range(0, len(text), 4)]
    return Stream([chunk({"role": "assistant", "content": ""}), *pieces, chunk({}, "stop")])


def says_nothing_under_auto(text: str = "") -> Rule:
    """A `rule` that answers as llama-cpp-python's `chatml-function-calling` format does
    when the model answers in text: under `tool_choice: "auto"` its grammar allows only
    the end of the turn (no text) or a tool-call marker (`functions.add:`, left as the
    text); the default text otherwise."""

    def rule(body: dict[str, Any]) -> Answer | None:
        return silent(bool(body.get("stream")), text) if body.get("tool_choice") == "auto" else None

    return rule


def always_empty(body: dict[str, Any]) -> Answer:
    """A `rule` that answers every call with an empty message."""
    return silent(bool(body.get("stream")))


class RecordingUpstream:
    """The server; `seen` holds every request, `received` each chat request body, in
    arrival order."""

    def __init__(
        self,
        props: dict[str, Any] | None = None,
        models: list[dict[str, Any]] | None = None,
        tokens_per_char: float | None = None,
    ) -> None:
        """`tokens_per_char`: serve llama-cpp-python's `POST /extras/tokenize`, counting
        that many tokens per character; other paths than chat completions answer 404."""
        self.seen: list[Seen] = []
        self.received: list[dict[str, Any]] = []
        self.script: deque[Answer] = deque()
        self.rule: Rule | None = None
        self.props = props
        self.models = models
        self.tokens_per_char = tokens_per_char
        self._lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                upstream.seen.append(Seen("GET", self.path, None))
                if self.path == "/props" and upstream.props is not None:
                    self._json(200, upstream.props)
                elif self.path == "/v1/models" and upstream.models is not None:
                    self._json(200, {"object": "list", "data": upstream.models})
                else:
                    self._json(404, {"error": {"message": "no such path", "code": None}})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                upstream.seen.append(Seen("POST", self.path, body))
                if not self.path.endswith("/chat/completions"):
                    if self.path == "/extras/tokenize" and upstream.tokens_per_char:
                        count = int(len(body["input"]) * upstream.tokens_per_char)
                        self._json(200, {"tokens": list(range(count))})
                    else:
                        self._json(404, {"error": {"message": "no such path", "code": None}})
                    return
                with upstream._lock:
                    upstream.received.append(body)
                    answer = upstream.script.popleft() if upstream.script else None
                if answer is None and upstream.rule is not None:
                    answer = upstream.rule(body)
                if answer is None:
                    answer = text_stream() if body.get("stream") else Reply(completion())
                if isinstance(answer, Stream):
                    self._stream(answer)
                    return
                if isinstance(answer, Raw):
                    self._raw(answer)
                    return
                if answer.delay:
                    time.sleep(answer.delay)
                self._json(answer.status, answer.body, answer.headers)

            def _json(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(raw)

            def _raw(self, answer: Raw) -> None:
                self.send_response(answer.status)
                self.send_header("content-type", answer.content_type)
                self.send_header("connection", "close")
                self.end_headers()
                self.wfile.write(answer.body)
                self.wfile.flush()
                self.close_connection = True

            def _stream(self, answer: Stream) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                for item in answer.chunks:
                    self.wfile.write(b"data: " + json.dumps(item).encode() + b"\n\n")
                if answer.done:
                    self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def paths(self) -> list[str]:
        """The path of every request, in arrival order."""
        return [seen.path for seen in self.seen]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def answer(self, *answers: Answer) -> None:
        """Queue scripted answers for the next requests."""
        with self._lock:
            self.script.extend(answers)

    def reset(self) -> None:
        with self._lock:
            self.seen.clear()
            self.received.clear()
            self.script.clear()
            self.rule = None

    def __enter__(self) -> RecordingUpstream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
