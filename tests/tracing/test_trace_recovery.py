"""A request recovered by another orchestrator (its first one was SIGKILLed mid-run) gets
a trace of its own, linked to the trace it was sent in."""

from __future__ import annotations

import secrets
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aredis

from hookbus.bus.keys import Keys
from hookbus.bus.store.journal import Journal
from tests.faults.helpers import read_until_terminal, submit
from tests.integration.processes import Processes
from tests.otlp_receiver import OtlpReceiver
from tests.tracing.test_trace_tree import GUARD, by_name, traced_env
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

STREAMING = "[[words:40]] [[delay:100]]"  # about 4 s of streaming


async def test_a_recovered_request_links_to_its_first_trace(service_env: dict[str, str], tmp_path: Path) -> None:
    with OtlpReceiver() as receiver:
        env = traced_env(service_env, receiver)
        procs = Processes(env, tmp_path)
        keys = Keys(env["HOOKBUS_PREFIX"])
        redis = aredis.Redis.from_url(env["REDIS_URL"])
        try:
            worker = procs.worker("guard", GUARD, replica="guard-1", claim_idle=1)
            one = procs.orchestrator("tests.tracing.traced_skills:agent", instance="orch-1", claim_idle=1)
            two = procs.orchestrator("tests.tracing.traced_skills:agent", instance="orch-2", claim_idle=1)
            await procs.wait_ready(worker, one, two)
            trace_id, sender_span = secrets.token_hex(16), secrets.token_hex(8)
            cid = f"chatcmpl-recover-{uuid.uuid4().hex[:8]}"
            await submit(
                redis, keys, STREAMING, completion_id=cid,
                trace={"traceparent": f"00-{trace_id}-{sender_span}-01"},
            )

            async def streaming() -> dict[str, str] | None:
                journal = Journal(redis, keys)
                return await journal.read(cid) if await journal.written(cid) >= 3 else None

            journal = await wait_for(streaming, timeout=20)
            assert journal, procs.logs()
            victim, survivor = (one, two) if journal["owner"] == "orch-1" else (two, one)
            victim.kill()
            outcome = await read_until_terminal(redis, keys, cid, timeout=30)

            async def recovered() -> list | None:
                spans = [s for s in by_name(receiver.spans(), "invoke_agent traced") if s.attributes.get("hookbus.mode") == "recover"]
                return spans or None

            spans = await wait_for(recovered, timeout=20)
        finally:
            procs.close()
            await redis.aclose()
    assert outcome.error is not None and outcome.error["code"] == "orchestrator_lost", outcome.items
    assert spans, sorted({s.name for s in receiver.spans()})
    (span,) = spans
    assert span.resource["service.instance.id"] == survivor.name
    assert span.trace_id != trace_id and span.parent_id == ""
    assert span.links == [(trace_id, sender_span)]
    assert span.status == "ERROR" and span.attributes["error.type"] == "orchestrator_lost"
    # the first trace holds what the lost orchestrator exported before it died
    assert any(s.resource["service.instance.id"] == victim.name for s in receiver.spans(trace_id))
    finalize = [s for s in receiver.spans(span.trace_id) if s.name == "finalize_connection"]
    assert len(finalize) == 1 and finalize[0].parent_id == span.span_id
