"""The OpenAI `model` field to the agent a request is for.

`"<agent>"` picks an agent served now, `"<agent>/<model>"` that agent with one of the
models it allows. While at most one agent is served, the gateway's own model names (what
it was started with: `--models`, else HOOKBUS_MODEL) keep working as they always did: the
request names no agent and goes to `requests`, which every orchestrator reads; with two
or more, a name that picks no agent is a 404 `model_not_found` at once. An agent whose
orchestrators are all gone answers a 503 `agent_unavailable`.

A key limited to some agents (`"agents"` in the keys file) gets a 403 for any other name,
served or not, so its answer never says whether an agent exists. The served view is the
client's cached `AgentsView` (refreshed in the background): routing costs no Redis round
trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hookbus.bus.groups.served_agents import ServedAgents
from hookbus.services.gateway.errors import GatewayError
from hookbus.skills import ServiceError


@dataclass(frozen=True)
class Route:
    agent: str | None
    """None: the request names no agent (a deployment of at most one agent)."""
    model: str | None = None


def route(model: str, served: ServedAgents, configured: Sequence[str], allowed: frozenset[str] | None) -> Route:
    """Where a request naming `model` goes, or the GatewayError it is answered with."""
    name, slash, sub = model.partition("/")
    if name in served.agents:
        _require_allowed(model, name, allowed)
        try:
            served.require(name, sub if slash else None)
        except ServiceError as exc:  # its 404 or 503, naming the field at fault
            raise GatewayError(exc.status_code, exc.code, exc.message, param="model") from None
        return Route(name, sub if slash else None)
    live = served.live
    if len(live) <= 1 and model in configured:
        if live:
            _require_allowed(model, live[0], allowed)
        return Route(None)
    _require_allowed(model, name, allowed)
    shown = ", ".join(listed(served, configured, allowed)) or "none"
    raise GatewayError(
        404, "model_not_found",
        f"The model `{model}` does not exist or you do not have access to it. Available: {shown}.",
        param="model",
    )


def listed(served: ServedAgents, configured: Sequence[str], allowed: frozenset[str] | None) -> list[str]:
    """What `GET /v1/models` lists for a key: the gateway's own model names while at most
    one agent is served (as before agents had names), else every agent served now and the
    `<agent>/<model>` names each allows."""
    live = served.live
    if len(live) <= 1:
        return list(configured) if allowed is None or not live or live[0] in allowed else []
    names: list[str] = []
    for name in live:
        if allowed is None or name in allowed:
            names += [name, *(f"{name}/{m}" for m in served.agents[name].card.models)]
    return names


def _require_allowed(model: str, agent: str, allowed: frozenset[str] | None) -> None:
    if allowed is not None and agent not in allowed:
        raise GatewayError(403, "model_not_allowed", f"This API key may not call the model `{model}`.", param="model")
