"""What the stack itself says happened: finalize log lines and the events firehose."""

from __future__ import annotations

import json
from collections import Counter

from pydantic import BaseModel, ValidationError

from hookbus.bus.wire.envelopes import MonitorRecord
from tests.deploy.check.stack import Stack

# Runs in a hookbus container: the newest events of the bus as JSON lines.
EVENTS_SCRIPT = """
import asyncio, os
from hookbus.bus.connection.cluster import keys_for
from hookbus.bus.connection.retrying import connect
from hookbus.bus.settings import get_settings
from hookbus.services.cli.monitor import recent_events

async def main():
    url = os.environ["REDIS_URL"]
    client = connect(url)
    for record in await recent_events(client, keys_for(url, get_settings().prefix)):
        print(record.model_dump_json())
    await client.aclose()

asyncio.run(main())
"""


class Finalized(BaseModel):
    """RequestLogger's `request_completed` line, written by its finalize_connection hook."""

    event: str
    session_id: str | None = None
    completion_id: str | None = None
    outcome: str


def finalized_sessions(stack: Stack) -> dict[str, list[Finalized]]:
    """session id -> its finalize log lines (one, when finalize ran once), from every
    telemetry container that ever ran."""
    found: dict[str, list[Finalized]] = {}
    for line in stack.logs("worker-telemetry"):
        start = line.find("{")
        if start < 0:
            continue
        try:
            entry = Finalized.model_validate_json(line[start:])
        except ValidationError:
            continue
        if entry.event == "request_completed" and entry.session_id:
            found.setdefault(entry.session_id, []).append(entry)
    return found


def events(stack: Stack) -> list[MonitorRecord]:
    lines = stack.exec("gateway", "python", "-c", EVENTS_SCRIPT).splitlines()
    return [MonitorRecord.model_validate(json.loads(line)) for line in lines if line.strip()]


def hops_by_replica(stack: Stack, group: str, since: float) -> Counter[str]:
    """Hops each replica of `group` ran since `since` (epoch seconds)."""
    return Counter(
        record.replica or "?"
        for record in events(stack)
        if record.kind == "hop" and record.group == group and record.ts >= since
    )
