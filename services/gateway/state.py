"""What the gateway's handlers share, kept apart from the app so route modules need not
import the app that routes to them."""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aredis
from starlette.requests import Request

from hookbus.bus.client import HookbusClient
from hookbus.bus.keys import Keys
from hookbus.bus.limits import RequestLimits
from hookbus.bus.store.stored_responses import StoredResponses
from hookbus.services.gateway.auth import Authenticator
from hookbus.services.gateway.metrics import GatewayMetrics


@dataclass
class Gateway:
    """What the handlers share (one per app, in `app.state.gateway`)."""

    client: HookbusClient
    keys: Keys
    authenticate: Authenticator
    models: list[str]
    limits: RequestLimits
    body_timeout: float
    stall_timeout: float
    metrics: GatewayMetrics
    probe: aredis.Redis  # no retries: a probe or a scrape answers at once when Redis is down
    responses: StoredResponses


def gateway_of(request: Request) -> Gateway:
    return request.app.state.gateway
