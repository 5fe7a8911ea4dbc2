"""Prometheus metrics of a gateway: its own traffic, the bus's latencies, and queue lag.

Three sources:

- **the gateway's requests** (`hookbus_gateway_*`): counted by an ASGI middleware and the
  chat handler: requests by path and status, errors by status and code (including errors
  that arrive mid-stream), latency, time to the first streamed chunk, disconnects;
- **the `events` stream** (`hookbus_stage_*`, `hookbus_hop*`, `hookbus_agent_*`,
  `hookbus_llm_retries`): a background task follows the monitor firehose from the moment
  the gateway started and turns each MonitorRecord (entries hold batches of them,
  hookbus.bus.store.events) into histogram observations - lifecycle stages per lifecycle
  and per hook group (`group="local"` for in-process hooks), hops per worker group, and
  whole requests as the orchestrators saw them - and counts the LLM calls asked again. These describe the whole bus, not just this
  gateway's requests: with several gateways, aggregate them with `max`, not `sum`;
- **queue state, read on scrape** (`hookbus_queue_*`): XINFO GROUPS of `requests`
  (group `orchestrators`) and of `hooks:{group}` (with its versions' streams) for every announced worker group - lag
  (entries not yet delivered to the group) and pending (delivered, not yet acked) - plus
  live replicas per group and live orchestrators; per worker group and version, the live
  replicas and the requests pinned to it that have not ended (hookbus.bus.groups.versions),
  and from the events stream the hops each version answered, by outcome (a canary's error
  rate beside the stable version's); per observer group, the observations its backlog
  bound dropped (`hookbus_observations_dropped*`, hookbus.bus.groups.observer_backlog).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import redis.asyncio as aredis
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hookbus.bus.connection.cluster import latest_ids, xread_streams
from hookbus.bus.connection.retrying import RECONNECT_ERRORS
from hookbus.bus.connection.values import text_or_none
from hookbus.bus.groups.observer_backlog import read_drops
from hookbus.bus.groups.periodic import cancel_and_wait
from hookbus.bus.groups.registry import REPLICA_TTL
from hookbus.bus.groups.served_agents import ORCHESTRATOR_TTL, AgentsView
from hookbus.bus.groups.versions import VersionState, live_versions, serving_counts
from hookbus.bus.keys import ORCHESTRATOR_GROUP, Keys
from hookbus.bus.wire.envelopes import (
    LLM_RETRY,
    LLM_RETRY_REASONS,
    DecodeError,
    MonitorRecord,
    monitor_records,
)
from hookbus.skills import HookbusError

log = structlog.get_logger("hookbus.gateway")

LAG_COUNT_CAP = 10_000
SCRAPE_TIMEOUT = 2.0
FOLLOW_EVERY = 0.1
"""The events follower reads at most this often (the histograms lag by as much)."""

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
HOOK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

AGENT_PATHS = ("/v1/chat/completions", "/v1/responses")
"""Where a request runs the agent (counted in flight while it is answered)."""
KNOWN_PATHS = (*AGENT_PATHS, "/v1/models", "/healthz", "/metrics", "/openapi.json")


KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def method_label(method: str) -> str:
    """A bounded label: the HTTP method, or `other` (a client may send any token as one)."""
    return method if method in KNOWN_METHODS else "other"


def path_label(path: str) -> str:
    """A bounded label: the route template, or `other`."""
    if path in KNOWN_PATHS:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{model}"
    if path.startswith("/v1/responses/"):
        return "/v1/responses/{response_id}"
    return "other"


class GatewayMetrics:
    """Every metric of one gateway app, in a registry of its own."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "hookbus_gateway_requests", "HTTP requests answered, by path and status.",
            ["method", "path", "status"], registry=r,
        )
        self.errors = Counter(
            "hookbus_gateway_errors",
            "Errors returned to clients (as a status or as a mid-stream error event), by status and code.",
            ["status", "code"], registry=r,
        )
        self.latency = Histogram(
            "hookbus_gateway_request_duration_seconds",
            "Time from a request's arrival to the end of its response.",
            ["path"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.first_chunk = Histogram(
            "hookbus_gateway_time_to_first_chunk_seconds",
            "Time from a streamed request's arrival to its first chunk.",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.in_flight = Gauge(
            "hookbus_gateway_in_flight_requests", "Agent requests (chat completions, responses) being answered now.", registry=r
        )
        self.disconnects = Counter(
            "hookbus_gateway_client_disconnects",
            "Clients that went away before their answer ended (their request was cancelled).",
            registry=r,
        )
        # from the events stream
        self.stage_latency = Histogram(
            "hookbus_stage_duration_seconds",
            "One lifecycle stage segment as the orchestrator timed it, per lifecycle and hook group.",
            ["lifecycle", "group"], buckets=HOOK_BUCKETS, registry=r,
        )
        self.stages = Counter(
            "hookbus_stages", "Lifecycle stage segments run, by outcome.",
            ["lifecycle", "group", "outcome"], registry=r,
        )
        self.hop_latency = Histogram(
            "hookbus_hop_duration_seconds",
            "Time a worker replica spent on one hop, per worker group and lifecycle.",
            ["group", "lifecycle"], buckets=HOOK_BUCKETS, registry=r,
        )
        self.hops = Counter(
            "hookbus_hops", "Hops answered by worker groups, by outcome.",
            ["group", "lifecycle", "outcome"], registry=r,
        )
        self.agent_latency = Histogram(
            "hookbus_agent_request_duration_seconds",
            "A whole request as an orchestrator ran it (queue wait excluded).",
            ["outcome"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.agent_requests = Counter(
            "hookbus_agent_requests", "Requests the orchestrators finished, by outcome.",
            ["outcome"], registry=r,
        )
        self.takeovers = Counter(
            "hookbus_agent_takeovers",
            "Requests an orchestrator took over from one that died, by how they ended there "
            "(resumed: the run went on from its journal; lost: a stream whose client had text "
            "already, ended with 503 orchestrator_lost).",
            ["how"], registry=r,
        )
        self.llm_retries = Counter(
            "hookbus_llm_retries",
            "LLM calls whose answer was not taken and which were asked again, by reason "
            "(empty_answer: no text and no tool call under tool_choice auto, asked again with none).",
            ["reason"], registry=r,
        )
        self.events_read = Counter(
            "hookbus_gateway_events_read", "Monitor records this gateway read from the events stream.",
            registry=r,
        )
        # read on scrape
        self.queue_lag = Gauge(
            "hookbus_queue_lag", "Entries of a stream not yet delivered to its consumer group.",
            ["stream", "group"], registry=r,
        )
        self.queue_pending = Gauge(
            "hookbus_queue_pending", "Entries delivered to a consumer group and not yet acked.",
            ["stream", "group"], registry=r,
        )
        self.queue_consumers = Gauge(
            "hookbus_queue_consumers", "Consumers of a stream's consumer group.",
            ["stream", "group"], registry=r,
        )
        self.replicas = Gauge(
            "hookbus_worker_replicas", "Worker replicas with a fresh heartbeat, per group.",
            ["group"], registry=r,
        )
        self.version_replicas = Gauge(
            "hookbus_worker_version_replicas", "Worker replicas with a fresh heartbeat, per group and version.",
            ["group", "version"], registry=r,
        )
        self.version_serving = Gauge(
            "hookbus_worker_version_serving_requests",
            "Requests pinned to a group's version that have not ended, per group and version.",
            ["group", "version"], registry=r,
        )
        self.version_hops = Counter(
            "hookbus_worker_version_hops", "Hops answered, per worker group, version and outcome.",
            ["group", "version", "outcome"], registry=r,
        )
        self.observations_dropped = Gauge(
            "hookbus_observations_dropped",
            "Observation entries (one per request) an observer group's backlog bound dropped, oldest first, "
            "since the count began (kept in Redis: every gateway shows the same).",
            ["group"], registry=r,
        )
        self.observations_dropped_bytes = Gauge(
            "hookbus_observations_dropped_bytes", "The bytes of Redis memory those dropped entries held.",
            ["group"], registry=r,
        )
        self.orchestrators = Gauge(
            "hookbus_orchestrators", "Orchestrators with a fresh heartbeat.", registry=r
        )
        self.redis_up = Gauge(
            "hookbus_gateway_redis_up", "1 if the last scrape could read Redis.", registry=r
        )

    # ------------------------------------------------------------- observations

    def count_error(self, error: HookbusError) -> None:
        self.errors.labels(str(error.status_code), error.code).inc()

    def observe_record(self, record: MonitorRecord) -> None:
        seconds = record.duration_ms / 1000
        if record.kind == "stage":
            group = record.group or "local"
            self.stage_latency.labels(record.lifecycle, group).observe(seconds)
            self.stages.labels(record.lifecycle, group, record.outcome).inc()
            if record.lifecycle == LLM_RETRY:
                self.llm_retries.labels(llm_retry_reason(record)).inc()
        elif record.kind == "hop":
            group = record.group or "unknown"
            self.hop_latency.labels(group, record.lifecycle).observe(seconds)
            self.hops.labels(group, record.lifecycle, record.outcome).inc()
            if record.version:
                self.version_hops.labels(group, record.version, record.outcome).inc()
        elif record.kind == "request":
            self.agent_latency.labels(record.outcome).observe(seconds)
            self.agent_requests.labels(record.outcome).inc()
            if (how := TAKEOVERS.get(record.lifecycle)) is not None:
                self.takeovers.labels(how).inc()

    async def scrape(self, client: aredis.Redis, keys: Keys) -> bytes:
        """The exposition text, with queue gauges refreshed from Redis first."""
        try:
            async with asyncio.timeout(SCRAPE_TIMEOUT):
                await self._refresh_queues(client, keys)
            self.redis_up.set(1)
        except (TimeoutError, *RECONNECT_ERRORS) as exc:
            log.warning("metrics_redis_unreachable", error=str(exc) or type(exc).__name__)
            self.redis_up.set(0)
        return generate_latest(self.registry)

    async def _refresh_queues(self, client: aredis.Redis, keys: Keys) -> None:
        groups = sorted(str(text_or_none(g)) for g in await client.hkeys(keys.registry))
        versions = {g: await live_versions(client, keys, g, alive_within=REPLICA_TTL) for g in groups}
        agents = sorted((await AgentsView(client, keys).refresh()).agents)
        streams = [("requests", s, ORCHESTRATOR_GROUP) for s in keys.request_streams] + [
            (f"requests:{a}", s, ORCHESTRATOR_GROUP) for a in agents for s in keys.agent_request_streams(a)
        ] + [
            (f"hooks:{g}", s, g) for g in groups
            for s in keys.hook_streams(g) + [p for v in versions[g] for p in keys.pinned_hook_streams(g, v)]
        ]
        now = time.time()
        async with client.pipeline(transaction=False) as pipe:
            for _label, stream, _group in streams:
                pipe.xinfo_groups(stream)
            for group in groups:
                pipe.zcount(keys.replicas(group), now - REPLICA_TTL, "+inf")
            pipe.zcount(keys.orchestrators, now - ORCHESTRATOR_TTL, "+inf")
            results = await pipe.execute(raise_on_error=False)
        infos = results[: len(streams)]
        counts = results[len(streams) :]
        for gauge in (self.queue_lag, self.queue_pending, self.queue_consumers, self.replicas):
            gauge.clear()
        totals: dict[tuple[str, str], list[int]] = {}  # summed over the shards of a stream
        for (label, stream, group), info in zip(streams, infos, strict=True):
            if isinstance(info, Exception):
                continue  # the stream does not exist yet
            entry = next((g for g in info if text_or_none(g.get("name")) == group), None)
            if entry is None:
                continue
            lag = entry.get("lag")
            if lag is None:  # Redis < 7 has no lag field: count what is after last-delivered-id
                last = text_or_none(entry.get("last-delivered-id")) or "0-0"
                lag = len(await client.xrange(stream, f"({last}", "+", count=LAG_COUNT_CAP) or [])
            total = totals.setdefault((label, group), [0, 0, 0])
            total[0] += int(lag)
            total[1] += int(entry.get("pending") or 0)
            total[2] = max(total[2], int(entry.get("consumers") or 0))
        for (label, group), (lag, pending, consumers) in totals.items():
            self.queue_lag.labels(label, group).set(lag)
            self.queue_pending.labels(label, group).set(pending)
            self.queue_consumers.labels(label, group).set(consumers)
        for group, count in zip(groups, counts[:-1], strict=True):
            if not isinstance(count, Exception):
                self.replicas.labels(group).set(int(count))
        if not isinstance(counts[-1], Exception):
            self.orchestrators.set(int(counts[-1]))
        await self._refresh_versions(client, keys, versions)
        for group, drops in (await read_drops(client, keys)).items():
            self.observations_dropped.labels(group).set(drops.entries)
            self.observations_dropped_bytes.labels(group).set(drops.bytes)

    async def _refresh_versions(self, client: aredis.Redis, keys: Keys, versions: dict[str, dict[str, VersionState]]) -> None:
        self.version_replicas.clear()
        self.version_serving.clear()
        for group, states in versions.items():
            serving = await serving_counts(client, keys, group, states)
            for version, state in states.items():
                self.version_replicas.labels(group, version).set(len(state.replicas))
                self.version_serving.labels(group, version).set(serving[version])


TAKEOVERS = {"request:resume": "resumed", "request:recover": "lost"}
"""The request records of a takeover (an orchestrator's run mode: `request:{mode}`), as the
takeover counter's label."""


def llm_retry_reason(record: MonitorRecord) -> str:
    """The reason of an LLM_RETRY record, as a bounded label (`other` when unknown: the
    record came from another process, maybe another version)."""
    reason = (record.error or "").partition(":")[0]
    return reason if reason in LLM_RETRY_REASONS else "other"


class EventsFollower:
    """Follows the `events` stream from where it was at start, feeding GatewayMetrics;
    it reads every FOLLOW_EVERY seconds at most, so one read takes the entries of many
    flushes (of every process) while the bus is busy."""

    def __init__(self, reader: aredis.Redis, keys: Keys, metrics: GatewayMetrics) -> None:
        self._reader = reader
        self._streams = keys.event_streams
        self._metrics = metrics
        self._positions: dict[str, Any] | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        with contextlib.suppress(TimeoutError, *RECONNECT_ERRORS):
            async with asyncio.timeout(SCRAPE_TIMEOUT):
                await self._position()
        self._task = asyncio.create_task(self._loop(), name="hookbus-gateway-events")

    async def stop(self) -> None:
        """Cancelled until it stops: redis-py can swallow one cancel landing in a read."""
        await cancel_and_wait(self._task)
        self._task = None

    async def _position(self) -> None:
        """Start at the streams' current ends (what `$` means, fixed now so nothing is missed)."""
        self._positions = await latest_ids(self._reader, self._streams)

    async def _loop(self) -> None:
        while True:
            try:
                if self._positions is None:
                    await self._position()
                positions = self._positions or {}
                response = await xread_streams(self._reader, positions, count=1000, block_ms=2000)
            except RECONNECT_ERRORS as exc:
                log.warning("events_read_failed", error=str(exc))
                await asyncio.sleep(1.0)
                continue
            for stream, entries in response:
                positions[str(text_or_none(stream))] = entries[-1][0]
                for _entry_id, fields in entries:
                    try:
                        records = monitor_records(fields)
                    except DecodeError:
                        continue
                    self._metrics.events_read.inc(len(records))
                    for record in records:
                        self._metrics.observe_record(record)
            if response:  # let entries gather: one read per FOLLOW_EVERY, not one per flush
                await asyncio.sleep(FOLLOW_EVERY)


class MetricsMiddleware:
    """Counts every HTTP request by path and status and times it to the end of its body."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        agent = scope["path"] in AGENT_PATHS
        if agent:
            self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_status)
        finally:
            if agent:
                self.metrics.in_flight.dec()
            override = scope.get("state", {}).get("final_status")
            path = path_label(scope["path"])
            self.metrics.requests.labels(method_label(scope["method"]), path, str(override or status)).inc()
            self.metrics.latency.labels(path).observe(time.perf_counter() - started)
