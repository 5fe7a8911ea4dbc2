"""The gateway counts takeovers from the orchestrators' request records: runs that went on
on a sibling after their orchestrator died, and those that could not (issue 48)."""

from __future__ import annotations

from hookbus.bus.wire.envelopes import MonitorRecord
from hookbus.services.gateway.metrics import GatewayMetrics


def test_takeovers_are_counted_by_how_they_ended():
    metrics = GatewayMetrics()
    for lifecycle in ("request", "request:resume", "request:resume", "request:recover", "request:cancelled"):
        metrics.observe_record(MonitorRecord(kind="request", completion_id="chatcmpl-t", lifecycle=lifecycle))
    counted = {
        how: metrics.registry.get_sample_value("hookbus_agent_takeovers_total", {"how": how})
        for how in ("resumed", "lost")
    }
    assert counted == {"resumed": 2.0, "lost": 1.0}
