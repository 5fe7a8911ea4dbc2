"""Where a request's waterfall is, as `hookbus monitor` and the logs name it."""

from __future__ import annotations

from hookbus.bus.wire.envelopes import MonitorRecord
from hookbus.services.cli.monitor import format_event
from hookbus.services.console import request_link
from hookbus.skills.outcome import Outcome


def test_monitor_ends_a_request_line_with_its_console_path_and_only_that_line() -> None:
    ended = MonitorRecord(kind="request", completion_id="chatcmpl-abc", lifecycle="request", outcome=Outcome.FAILED)
    stage = MonitorRecord(kind="stage", completion_id="chatcmpl-abc", lifecycle="on_connection")
    assert format_event(ended, with_link=True).endswith("  /console/#/requests/chatcmpl-abc")
    assert "/console/" not in format_event(stage, with_link=True)
    assert "/console/" not in format_event(ended)
    assert request_link("chatcmpl-abc", "http://gw:8000/") == "http://gw:8000/console/#/requests/chatcmpl-abc"
