"""The gateway's Starlette app: routes, auth, errors, metrics, and the events follower.

    app = create_app(client, api_keys={"sk-1": {"peer_user_id": "alice", "scopes": []}})

Routes: `POST /v1/chat/completions`, `POST /v1/responses`, `GET` and `DELETE
/v1/responses/{id}`, `GET /v1/models`, `GET /v1/models/{model}`,
`GET /healthz`, `GET /metrics`, `GET /openapi.json`, and the web console under `/console/`
(hookbus.services.console.routes: admin keys only). The app does not own `client`:
whoever made it closes it (hookbus.services.gateway.server does).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import redis.asyncio as aredis
import structlog
from prometheus_client import CONTENT_TYPE_LATEST
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hookbus.bus.client import HookbusClient
from hookbus.bus.groups.registry import REPLICA_TTL
from hookbus.bus.limits import RequestLimits
from hookbus.bus.settings import get_settings
from hookbus.bus.store.stored_responses import STORED_RESPONSE_TTL, StoredResponses
from hookbus.services.console.routes import attach_console, console_mount
from hookbus.services.gateway.agent_routes import listed
from hookbus.services.gateway.auth import ApiKey, Authenticator, normalize_keys
from hookbus.services.gateway.chat_completions import chat_completions
from hookbus.services.gateway.cross_site import CrossSiteGuard
from hookbus.services.gateway.edge_options import BODY_TIMEOUT, STALL_TIMEOUT
from hookbus.services.gateway.errors import ERROR_HANDLERS, GatewayError
from hookbus.services.gateway.key_limits import KeyLimits
from hookbus.services.gateway.metrics import (
    ORCHESTRATOR_TTL,
    EventsFollower,
    GatewayMetrics,
    MetricsMiddleware,
)
from hookbus.services.gateway.models import MODEL_CREATED, Health, ModelCard, ModelList
from hookbus.services.gateway.openapi import openapi_document
from hookbus.services.gateway.responses_api import (
    create_response,
    stored_response,
)
from hookbus.services.gateway.state import Gateway, gateway_of
from hookbus.services.observability import tracing

log = structlog.get_logger("hookbus.gateway")

HEALTH_TIMEOUT = 2.0
LEASE_MARGIN = 60.0
"""A request's slot among its key's parallel requests outlives its deadline by this much."""


def default_models() -> list[str]:
    return [get_settings().served_model]


def create_app(
    client: HookbusClient,
    *,
    api_keys: dict[str, ApiKey | dict[str, Any]] | None,
    models: Sequence[str] | None = None,
    limits: RequestLimits | None = None,
    body_timeout: float = BODY_TIMEOUT,
    allowed_hosts: Sequence[str] = (),
    stored_response_ttl: int = STORED_RESPONSE_TTL,
    stall_timeout: float = STALL_TIMEOUT,
) -> Starlette:
    """The ASGI app; `api_keys=None` turns auth off (logged as a warning at start).

    `limits` bound every request body (hookbus.bus.limits); `body_timeout` is how long a
    client may take to send one. Without keys, the app answers only JSON bodies and
    loopback or `allowed_hosts` Host names (hookbus.services.gateway.cross_site); with
    keys, it holds each key to its own limits (hookbus.services.gateway.key_limits).
    Stored Responses API responses expire after `stored_response_ttl` seconds. A streamed
    answer whose client takes no write for `stall_timeout` seconds (at most the client's
    timeout, the request deadline) is ended (hookbus.services.gateway.sse)."""
    keys = normalize_keys(api_keys)
    metrics = GatewayMetrics()
    reader: aredis.Redis = getattr(client, "_reader", client.redis)  # the client's retry-free connection
    gateway = Gateway(
        client=client,
        keys=client.keys,
        authenticate=Authenticator(keys),
        models=list(models) if models else default_models(),
        limits=limits or RequestLimits(),
        body_timeout=body_timeout,
        stall_timeout=min(stall_timeout, client.timeout),
        metrics=metrics,
        probe=reader,
        responses=StoredResponses(client.redis, client.keys, stored_response_ttl),
    )
    follower = EventsFollower(reader, client.keys, metrics)
    if keys is None:
        edge_guard = Middleware(CrossSiteGuard, allowed_hosts=allowed_hosts)
    else:
        edge_guard = Middleware(
            KeyLimits, authenticator=gateway.authenticate, redis=client.redis, keys=client.keys,
            lease_seconds=client.timeout + LEASE_MARGIN,
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if keys is None:
            log.warning(
                "gateway_auth_disabled",
                message="AUTH IS OFF: anyone who can reach this port can use the agent. "
                "Pass --api-keys FILE or set HOOKBUS_API_KEYS.",
            )
        else:
            log.info("gateway_auth_enabled", keys=len(keys))
        await follower.start()
        await client.agents.start()
        log.info("gateway_started", prefix=client.keys.prefix, models=gateway.models)
        try:
            yield
        finally:
            await follower.stop()
            await client.agents.stop()
            await app.state.console.data.stop()
            log.info("gateway_stopped")

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/responses", create_response, methods=["POST"]),
            Route("/v1/responses/{response_id}", stored_response, methods=["GET", "DELETE"]),
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
            Route("/openapi.json", openapi_endpoint, methods=["GET"]),
            console_mount(),
        ],
        middleware=[*tracing.gateway_middleware(), Middleware(MetricsMiddleware, metrics=metrics), edge_guard],
        exception_handlers=dict(ERROR_HANDLERS),
        lifespan=lifespan,
    )
    app.state.gateway = gateway
    app.state.metrics = metrics
    attach_console(app, reader, client.keys, gateway.authenticate)
    return app


# ------------------------------------------------------------------- handlers


async def list_models(request: Request) -> Response:
    """The models the caller may name now: while at most one agent is served, the
    gateway's own; else the agents served now (hookbus.services.gateway.agent_routes)."""
    cards = [ModelCard(id=m, created=MODEL_CREATED) for m in _listed(request)]
    return JSONResponse(ModelList(data=cards).model_dump())


async def retrieve_model(request: Request) -> Response:
    model = request.path_params["model"]
    if model not in _listed(request):
        raise GatewayError(404, "model_not_found", f"The model `{model}` does not exist.", param="model")
    return JSONResponse(ModelCard(id=model, created=MODEL_CREATED).model_dump())


def _listed(request: Request) -> list[str]:
    gw = gateway_of(request)
    gw.authenticate(request)
    return listed(gw.client.agents.current, gw.models, request.state.allowed_agents)


async def healthz(request: Request) -> Response:
    """200 when Redis answers PING and an orchestrator heartbeat is fresh (10 s); else 503.

    The body says why only to a caller with a valid key (or any caller when auth is off):
    instance names and worker groups are not for anonymous probes."""
    gw = gateway_of(request)
    client = gw.probe
    redis_status = "ok"
    orchestrators: list[str] = []
    groups: dict[str, int] = {}
    try:
        async with asyncio.timeout(HEALTH_TIMEOUT):
            await client.ping()
            now = time.time()
            async with client.pipeline(transaction=False) as pipe:
                pipe.zrangebyscore(gw.keys.orchestrators, now - ORCHESTRATOR_TTL, "+inf")
                pipe.hkeys(gw.keys.registry)
                members, names = await pipe.execute()
            orchestrators = sorted(m.decode() for m in members)
            names = sorted(n.decode() for n in names)
            async with client.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.zcount(gw.keys.replicas(name), now - REPLICA_TTL, "+inf")
                counts = await pipe.execute()
            groups = dict(zip(names, (int(c) for c in counts), strict=True))
    except (TimeoutError, RedisError, OSError) as exc:
        redis_status = f"unreachable: {exc or type(exc).__name__}"
    ok = redis_status == "ok" and bool(orchestrators)
    health = Health(
        status="ok" if ok else "unavailable",
        redis=redis_status,
        orchestrators=orchestrators,
        worker_groups=groups,
    )
    detailed = not gw.authenticate.enabled or gw.authenticate.lookup(request.headers) is not None
    body = health.model_dump() if detailed else {"status": health.status}
    return JSONResponse(body, status_code=200 if ok else 503)


async def metrics_endpoint(request: Request) -> Response:
    gw = gateway_of(request)
    body = await gw.metrics.scrape(gw.probe, gw.keys)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


async def openapi_endpoint(request: Request) -> Response:
    gw = gateway_of(request)
    return JSONResponse(openapi_document(gw.models, auth=gw.authenticate.enabled))
