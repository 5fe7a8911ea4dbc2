"""One OpenTelemetry trace per request across real gateway, orchestrator and worker
processes, exported over OTLP/HTTP (protobuf) to a receiver started in the test.

The client is the official `openai` client, sending its own W3C `traceparent`.
"""

from __future__ import annotations

import json
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from hookbus import HookbusClient, HookError
from tests.integration.processes import Processes
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.waiting import wait_for

MARKER = "zebra-umbrella-42"
"""A word of the user's message: it must appear in no span unless content capture is on."""
TOOL_PROMPT = f'[[tool:weather {{"city": "Oslo"}}]] {MARKER}'
GUARD = "tests.tracing.traced_skills:Guard"
API_KEY = "sk-traced-0123456789abcdef"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


def traced_env(service_env: dict[str, str], receiver: OtlpReceiver, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in service_env.items() if not k.startswith("OTEL_")}
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_BSP_SCHEDULE_DELAY="100", **extra)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def start_stack(
    env: dict[str, str], log_dir: Path, *, gateway: bool, skills: tuple[str, ...] = (GUARD,)
) -> tuple[Processes, str]:
    procs = Processes(env, log_dir)
    worker = procs.worker("guard", *skills, replica="guard-1")
    orchestrator = procs.orchestrator("tests.tracing.traced_skills:agent", instance="orch-1")
    url = ""
    try:
        await procs.wait_ready(worker, orchestrator)
        if gateway:
            port = free_port()
            keys = log_dir / "api-keys.json"
            keys.write_text(json.dumps({API_KEY: {"peer_user_id": "alice", "scopes": []}}))
            proc = procs.gateway(name="gateway-1", port=port, api_keys=keys)
            url = f"http://127.0.0.1:{port}"
            await procs.wait_http(proc, f"{url}/v1/models")
    except BaseException:
        procs.close()
        raise
    return procs, url


def by_name(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name]


def one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = by_name(spans, name)
    assert len(found) == 1, f"{len(found)} spans named {name!r}: {sorted(s.name for s in spans)}"
    return found[0]


def children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    return [s for s in spans if s.parent_id == parent.span_id]


def request_done(receiver: OtlpReceiver, trace_id: str) -> Callable[[], Awaitable[list[ReceivedSpan] | None]]:
    """The spans of the trace once the gateway's, the orchestrator's and the worker's last
    spans of the request all arrived."""

    async def check() -> list[ReceivedSpan] | None:
        spans = receiver.spans(trace_id)
        names = {s.name for s in spans}
        if {"POST /v1/chat/completions", "invoke_agent traced", "finalize_connection", "hook guard.settle"} <= names:
            return spans
        return None

    return check


def new_chat_trace(receiver: OtlpReceiver, known: set[str]) -> str | None:
    """The trace id of a chat completion request whose trace is not in `known`."""
    for span in receiver.spans():
        if span.name == "POST /v1/chat/completions" and span.trace_id not in known:
            return span.trace_id
    return None


async def test_one_trace_spans_the_gateway_the_orchestrator_and_the_worker(
    service_env: dict[str, str], receiver: OtlpReceiver, tmp_path: Path
) -> None:
    procs, url = await start_stack(traced_env(service_env, receiver), tmp_path, gateway=True)
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    try:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=30) as client:
            completion = await client.chat.completions.create(
                model="offline", messages=[{"role": "user", "content": TOOL_PROMPT}],
                temperature=0.3, max_tokens=200, seed=7,
                extra_headers={"traceparent": f"00-{trace_id}-{client_span}-01"},
            )
            spans = await wait_for(request_done(receiver, trace_id), timeout=20)
            assert spans, f"spans received: {sorted({s.name for s in receiver.spans()})}\n{procs.logs()}"

            second = await client.chat.completions.create(
                model="offline", messages=[{"role": "user", "content": "[[words:3]]"}], stream=True,
            )
            async for _ in second:
                pass
            other_id = await wait_for(lambda: _now(new_chat_trace(receiver, {trace_id})), timeout=20)
            assert other_id, sorted({s.name for s in receiver.spans()})
            other = await wait_for(request_done(receiver, other_id), timeout=20)
    finally:
        procs.close()
    assert completion.choices[0].message.content == "The tool weather returned: sunny in Oslo"
    spans = receiver.spans(trace_id)
    services = {s.service for s in spans}
    assert services == {"hookbus-gateway", "hookbus-orchestrator", "hookbus-worker"}, services
    instances = {s.service: s.resource.get("service.instance.id") for s in spans}
    assert instances["hookbus-orchestrator"] == "orch-1" and instances["hookbus-worker"] == "guard-1"
    assert instances["hookbus-gateway"].startswith("gateway-")

    # the gateway continues the client's span; the orchestrator continues the gateway's
    server = one(spans, "POST /v1/chat/completions")
    assert server.parent_id == client_span and server.kind == "SERVER"
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["hookbus.completion_id"] == completion.id
    request = one(spans, "invoke_agent traced")
    assert request.parent_id == server.span_id and request.service == "hookbus-orchestrator"
    assert request.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert request.attributes["gen_ai.agent.name"] == "traced"
    assert request.attributes["hookbus.completion_id"] == completion.id
    assert request.status == "UNSET"

    # a span per lifecycle stage that has hooks, each a child of the request span
    stages = {s.name: s for s in children(spans, request) if s.attributes.get("hookbus.lifecycle")}
    assert {"on_connection", "before_llm_call", "before_toolcall", "finalize_connection"} <= set(stages)
    assert len(by_name(spans, "before_llm_call")) == 2  # two rounds: the tool call, then the answer

    # on_connection: hop (orchestrator) -> process (worker) -> the hook (worker)
    (hop,) = children(spans, stages["on_connection"])
    assert hop.name == "hop guard" and hop.kind == "CLIENT" and hop.service == "hookbus-orchestrator"
    assert hop.attributes["hookbus.hooks"] == ["guard.admit"]
    assert hop.attributes["hookbus.replica"] == "guard-1"
    (process,) = children(spans, hop)
    assert process.name == "process guard" and process.kind == "CONSUMER"
    assert process.service == "hookbus-worker" and process.attributes["hookbus.attempt"] == 1
    (hook,) = children(spans, process)
    assert hook.name == "hook guard.admit" and hook.service == "hookbus-worker"
    assert hop.start_ns <= process.start_ns <= hook.start_ns <= hook.end_ns <= process.end_ns <= hop.end_ns

    # an in-process hook is a child of its stage span in the orchestrator
    for stage in by_name(spans, "before_llm_call"):
        (local,) = children(spans, stage)
        assert local.name == "hook notes.note" and local.service == "hookbus-orchestrator"

    # LLM calls: GenAI inference spans
    chats = sorted(by_name(spans, "chat offline"), key=lambda s: s.start_ns)
    assert len(chats) == 2
    for chat in chats:
        assert chat.parent_id == request.span_id and chat.kind == "CLIENT"
        attributes = chat.attributes
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.request.model"] == "offline"
        assert attributes["gen_ai.response.model"] == "offline"
        assert attributes["gen_ai.provider.name"] == "openai" and attributes["gen_ai.system"] == "openai"
        assert attributes["gen_ai.usage.input_tokens"] > 0 and attributes["gen_ai.usage.output_tokens"] > 0
        assert attributes["server.address"] == "127.0.0.1"
    assert chats[0].attributes["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert chats[1].attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert chats[0].attributes["gen_ai.request.tool_names"] == ["weather"]
    for chat in chats:  # the client's sampling fields, as the LLM got them
        assert chat.attributes["gen_ai.request.temperature"] == 0.3
        assert chat.attributes["gen_ai.request.max_tokens"] == 200
        assert chat.attributes["gen_ai.request.seed"] == 7

    # the tool: an execute_tool span, its hop to the worker group below it
    tool = one(spans, "execute_tool weather")
    assert tool.parent_id == request.span_id
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "weather"
    assert tool.attributes["gen_ai.tool.call.id"].startswith("call_")
    (tool_hop,) = children(spans, tool)
    assert tool_hop.name == "hop guard" and tool_hop.attributes["hookbus.lifecycle"] == "tool"
    assert [s.name for s in children(spans, tool_hop)] == ["process guard"]

    # content is not recorded by default
    assert "gen_ai.input.messages" not in chats[0].attributes
    assert not [s.name for s in spans if MARKER in json.dumps(s.attributes)]

    # the worker's log line joins the trace
    worker_log = (tmp_path / "guard-1.log").read_text()
    admitted = [json.loads(line) for line in worker_log.splitlines() if '"guard_admitted"' in line]
    joined = [line for line in admitted if line.get("completion_id") == completion.id]
    assert joined and joined[0]["trace_id"] == trace_id and joined[0]["span_id"] == hook.span_id

    # a second request, with no traceparent: a new trace of its own, the gateway span its root
    assert other, sorted(s.name for s in receiver.spans(other_id))
    second_server = one(other, "POST /v1/chat/completions")
    assert second_server.parent_id == ""
    assert one(other, "invoke_agent traced").parent_id == second_server.span_id
    assert one(other, "chat offline").attributes["gen_ai.request.stream"] is True


async def _now(value: Any) -> Any:
    return value


def root_spans_done(receiver: OtlpReceiver, count: int) -> Callable[[], Awaitable[list[ReceivedSpan] | None]]:
    """Every span once `count` requests' orchestrator spans arrived with their finalize hooks."""

    async def check() -> list[ReceivedSpan] | None:
        spans = receiver.spans()
        if len(by_name(spans, "invoke_agent traced")) >= count and len(by_name(spans, "hook guard.settle")) >= count:
            return spans
        return None

    return check


async def test_failures_set_the_status_of_their_spans(
    service_env: dict[str, str], receiver: OtlpReceiver, tmp_path: Path
) -> None:
    env = traced_env(service_env, receiver)
    procs, _ = await start_stack(env, tmp_path, gateway=False, skills=(GUARD, "tests.tracing.traced_skills:Fails"))
    try:
        async with HookbusClient(env["REDIS_URL"], prefix=env["HOOKBUS_PREFIX"], timeout=30) as client:
            with pytest.raises(HookError) as refused:
                await client.complete("hello", auth={"peer_user_id": "broke"})
            answered = await client.complete("[[echo]] fine")
        spans = await wait_for(root_spans_done(receiver, 2), timeout=20)
    finally:
        procs.close()
    assert refused.value.status_code == 402
    assert answered.choices[0].message.content == "fine"
    requests = {s.attributes["hookbus.completion_id"]: s for s in by_name(spans, "invoke_agent traced")}

    # a HookError that aborts the run fails the request span, its stage, its hop and its hook
    (aborted,) = [s for cid, s in requests.items() if cid != answered.id]
    assert aborted.status == "ERROR" and aborted.attributes["error.type"] == "payment_required"
    assert aborted.attributes["hookbus.status_code"] == 402
    assert aborted.status_message == "no credit left"
    trace = [s for s in spans if s.trace_id == aborted.trace_id]
    (admit,) = [s for s in trace if s.name == "hook guard.admit"]
    assert admit.status == "ERROR" and admit.attributes["error.type"] == "payment_required"
    (stage,) = [s for s in trace if s.name == "on_connection"]
    assert stage.status == "ERROR"
    (settle,) = [s for s in trace if s.name == "hook guard.settle"]  # finalize still ran
    assert settle.status == "UNSET"

    # a hook that raises fails its own span; the request it did not stop stays ok
    ok = requests[answered.id]
    assert ok.status == "UNSET"
    (explode,) = [s for s in spans if s.trace_id == ok.trace_id and s.name == "hook fails.explode"]
    assert explode.status == "ERROR" and explode.attributes["error.type"] == "RuntimeError"
    assert "the after_llm_call hook broke" in explode.status_message
    (hop,) = [s for s in spans if s.span_id == _parent_of(spans, explode, hops=2)]
    assert hop.name == "hop guard" and hop.attributes["hookbus.hook_outcome"] == "failed"


def _parent_of(spans: list[ReceivedSpan], span: ReceivedSpan, *, hops: int) -> str:
    by_id = {s.span_id: s for s in spans}
    for _ in range(hops):
        span = by_id[span.parent_id]
    return span.span_id


async def test_message_content_is_recorded_only_when_the_operator_opts_in(
    service_env: dict[str, str], receiver: OtlpReceiver, tmp_path: Path
) -> None:
    env = traced_env(service_env, receiver, OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true")
    procs, _ = await start_stack(env, tmp_path, gateway=False)
    try:
        async with HookbusClient(env["REDIS_URL"], prefix=env["HOOKBUS_PREFIX"], timeout=30) as client:
            answered = await client.complete(TOOL_PROMPT)
        spans = await wait_for(root_spans_done(receiver, 1), timeout=20)
    finally:
        procs.close()
    assert answered.choices[0].message.content == "The tool weather returned: sunny in Oslo"
    first, second = sorted(by_name(spans, "chat offline"), key=lambda s: s.start_ns)
    sent = json.loads(first.attributes["gen_ai.input.messages"])
    assert sent[-1] == {"role": "user", "parts": [{"type": "text", "content": TOOL_PROMPT}]}
    asked = json.loads(first.attributes["gen_ai.output.messages"])
    assert asked[0]["role"] == "assistant" and asked[0]["finish_reason"] == "tool_calls"
    roles = [m["role"] for m in json.loads(second.attributes["gen_ai.input.messages"])]
    assert roles == ["user", "assistant", "tool"]
    answer = json.loads(second.attributes["gen_ai.output.messages"])
    assert answer == [{
        "role": "assistant", "finish_reason": "stop",
        "parts": [{"type": "text", "content": "The tool weather returned: sunny in Oslo"}],
    }]
    tool = one(spans, "execute_tool weather")
    assert json.loads(tool.attributes["gen_ai.tool.call.arguments"]) == {"city": "Oslo"}
    assert tool.attributes["gen_ai.tool.call.result"] == "sunny in Oslo"
