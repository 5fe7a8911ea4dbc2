"""A TypeScript worker group in the request's one trace: the orchestrator's `hop ts` span
is continued by the TypeScript worker's `process ts` span (service hookbus-worker, its
replica's name), with a `hook {key}` span per TypeScript hook below it; before, the
worker ignored the hop's trace context and the trace had a hole wherever it ran. Real
processes (gateway, orchestrator, a Python and a TypeScript group), OTLP/HTTP to a
receiver started in the test, the official `openai` client sending its `traceparent`."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import openai

from tests.integration.processes import Processes, free_port
from tests.otlp_receiver import OtlpReceiver
from tests.tracing.test_trace_tree import by_name, children, receiver, traced_env  # noqa: F401 - the fixture
from tests.typescript.conftest import API_KEYS, KEY, TS_SKILLS, ts_worker
from tests.waiting import wait_for

MS = 1_000_000


async def test_a_typescript_groups_hooks_are_spans_of_the_requests_trace(
    service_env: dict[str, str], receiver: OtlpReceiver, tmp_path: Path  # noqa: F811 - the fixture
) -> None:
    env = traced_env(service_env, receiver, HOOKBUS_TS_JOURNAL=str(tmp_path / "journal.jsonl"))
    (tmp_path / "journal.jsonl").touch()
    keys = tmp_path / "api-keys.json"
    keys.write_text(json.dumps(API_KEYS))
    procs = Processes(env, tmp_path / "logs")
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    try:
        ts = ts_worker(procs, "ts", TS_SKILLS, replica="ts-1")
        py = procs.worker("py", "tests.typescript.py_skills:OrderProbe", replica="py-1")
        orchestrator = procs.orchestrator("tests.typescript.py_skills:agent", instance="orch-1")
        port = free_port()
        gateway = procs.gateway(port=port, api_keys=keys)
        await procs.wait_ready(ts, py, orchestrator)
        await procs.wait_http(gateway, f"http://127.0.0.1:{port}/healthz")
        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=30) as client:
            completion = await client.chat.completions.create(
                model="offline", messages=[{"role": "user", "content": "[[echo]] a traced day"}],
                extra_headers={"traceparent": f"00-{trace_id}-{client_span}-01"},
            )

        async def ts_spans_in() -> bool:
            spans = receiver.spans(trace_id)
            return bool(by_name(spans, "process ts")) and any(s.name == "hook request-logger.endLogging" for s in spans)

        assert await wait_for(ts_spans_in, timeout=30), f"{sorted({s.name for s in receiver.spans()})}\n{procs.logs()}"
    finally:
        procs.close()
    assert completion.choices[0].message.content == "a traced day"
    spans = receiver.spans(trace_id)
    processes = by_name(spans, "process ts")
    for process in processes:
        assert process.kind == "CONSUMER" and process.service == "hookbus-worker"
        assert process.resource.get("service.instance.id") == "ts-1"
        assert process.attributes["hookbus.group"] == "ts" and process.attributes["hookbus.attempt"] == 1
        [hop] = [s for s in spans if s.span_id == process.parent_id]
        assert hop.name == "hop ts" and hop.service == "hookbus-orchestrator"
        hooks = children(spans, process)
        assert hooks and all(h.name.startswith("hook ") and h.service == "hookbus-worker" for h in hooks)
        # within a millisecond: the JavaScript SDK takes a span's start time to the millisecond
        assert hop.start_ns - MS <= process.start_ns <= min(h.start_ns for h in hooks) + MS
        assert max(h.end_ns for h in hooks) <= process.end_ns + MS and process.end_ns <= hop.end_ns + MS
    lifecycles = {p.attributes["hookbus.lifecycle"] for p in processes}
    assert {"on_connection", "finalize_connection"} <= lifecycles, lifecycles
    connection = [p for p in processes if p.attributes["hookbus.lifecycle"] == "on_connection"]
    hooked = {h.name for p in connection for h in children(spans, p)}
    assert {"hook analytics.trackRequest", "hook state-probe.relay"} <= hooked, hooked
