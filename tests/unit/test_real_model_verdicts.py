"""`make check-real-model`'s pieces that need no model: whose a failure is, which requests a
failed case replays, how a recorded answer reads, and the recording hop itself (against a
stand-in server of the standard library, over real HTTP)."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.real_model.recording_proxy import Exchange, RecordingProxy
from tests.real_model.replay import SAMPLED_REPLAYS, answer_of, failing_call, replay, replays_of
from tests.real_model.verdicts import Direct, Said, case_line, verdict

EMPTY_STREAM = (
    b'data: {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}\n\n'
    b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'
)
TEXT_STREAM = (
    b'data: {"choices": [{"index": 0, "delta": {"content": "Par"}}]}\n\n'
    b'data: {"choices": [{"index": 0, "delta": {"content": "is."}}]}\n\ndata: [DONE]\n\n'
)


def direct(ok: bool, decides: bool = True) -> Direct:
    return Direct("same request direct", Said(ok, "x"), decides)


def test_a_failure_whose_same_request_fails_direct_too_is_the_models() -> None:
    assert verdict(False, [direct(False), direct(False)]) == "MODEL"


def test_a_failure_whose_same_request_answers_direct_is_hookbuss() -> None:
    assert verdict(False, [direct(False), direct(True)]) == "FAIL"


def test_a_twin_that_is_another_request_decides_nothing() -> None:
    """The bare question failing straight to the server does not make hookbus's failure the
    model's, nor does it answering make it hookbus's when the same request failed."""
    assert verdict(False, [direct(False, decides=False)]) == "FAIL"
    assert verdict(False, [direct(True, decides=False), direct(False)]) == "MODEL"


def test_a_failure_with_no_direct_request_is_hookbuss_and_a_pass_is_a_pass() -> None:
    assert verdict(False, []) == "FAIL"
    assert verdict(True, [direct(False)]) == "PASS"


def test_the_line_names_the_verdict_and_every_side() -> None:
    text = case_line("hookbus send", Said(False, "exit 1"), [Direct("same request direct", Said(False, "''"), True)])
    assert text.startswith("MODEL hookbus send: through hookbus exit 1")
    assert "| same request direct ''" in text


def exchange(messages: list[dict[str, str]], **more: object) -> Exchange:
    return Exchange("/v1/chat/completions", json.dumps({"messages": messages, **more}).encode(), 200, EMPTY_STREAM)


def test_the_failing_call_is_the_last_request_with_those_asking_it_again_before_it() -> None:
    """hookbus asking an empty answer again with tool_choice "none" is the same call; an
    earlier tool round is not."""
    asked = [{"role": "user", "content": "q"}]
    rounds = [
        exchange(asked, tool_choice="auto"),
        exchange([*asked, {"role": "tool", "content": "3"}], tool_choice="auto"),
        exchange([*asked, {"role": "tool", "content": "3"}], tool_choice="none"),
    ]
    assert failing_call(rounds) == rounds[1:]
    assert failing_call(rounds[:1]) == rounds[:1]
    assert failing_call([]) == []


def test_a_recorded_answer_reads_as_text_tool_calls_or_error() -> None:
    assert not answer_of(200, EMPTY_STREAM).said_something
    assert answer_of(200, TEXT_STREAM).text == "Paris."
    completion = {"choices": [{"message": {"content": None, "tool_calls": [
        {"function": {"name": "add", "arguments": '{"a": 1}'}}]}}]}
    called = answer_of(200, json.dumps(completion).encode())
    assert called.said_something and called.tool_calls == ('add {"a": 1}',)
    refused = answer_of(400, b'{"error": "too long"}')
    assert not refused.said_something and refused.shown().startswith("HTTP 400")


class StandIn(BaseHTTPRequestHandler):
    """Answers a streamed request with a text stream, another with an empty one."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - the http.server hook's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        answer = TEXT_STREAM if body.get("stream") else EMPTY_STREAM
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        """Quiet."""


@pytest.fixture
def stand_in() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_the_hop_passes_requests_on_and_records_them_and_a_replay_sends_the_same_bytes(stand_in: int) -> None:
    proxy = RecordingProxy(stand_in)
    try:
        body = b'{"messages": [], "stream": true}'
        request = urllib.request.Request(f"http://127.0.0.1:{proxy.port}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.read() == TEXT_STREAM
        (recorded,) = proxy.since(0)
        assert recorded.body == body and recorded.answer == TEXT_STREAM and recorded.status == 200
        assert proxy.mark() == 1 and proxy.since(1) == []
        assert replay(recorded, f"http://127.0.0.1:{stand_in}").text == "Paris."
    finally:
        proxy.close()


def test_a_sampled_request_is_replayed_three_times_and_one_at_temperature_0_once() -> None:
    assert replays_of(exchange([], temperature=0)) == 1
    assert replays_of(exchange([])) == SAMPLED_REPLAYS == 3


def test_an_answer_the_server_gave_hookbus_that_passes_makes_the_failure_hookbuss() -> None:
    """The recorded answer and the replays decide together: an empty answer to hookbus and
    one empty replay is the model's; a text the server gave hookbus is hookbus's to lose."""
    recorded_empty, replays_once_empty = direct(False), direct(False)
    assert verdict(False, [recorded_empty, replays_once_empty]) == "MODEL"
    assert verdict(False, [direct(True), replays_once_empty]) == "FAIL"
