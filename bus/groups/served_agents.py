"""Which agents are served now, and by which orchestrators: what the gateway routes by.

An orchestrator writes the agents it serves into the `orchestrator-agents` hash (its
instance -> `ServedAgentsRecord`) with every heartbeat, so a Redis that lost its data
learns them again within a beat; its liveness is its heartbeat in `orchestrators`, as
before. A reader (the gateway, the client, `hookbus status`) keeps an `AgentsView`: one
pipeline (the heartbeats and the hash) refreshed in the background every half second,
or on demand when older than `MAX_AGE`, so that no request pays a Redis round trip for it.

An agent is *served* while one of its orchestrators' heartbeats is fresh
(`ORCHESTRATOR_TTL`), *known* while an orchestrator that served it is remembered at all (its
hash field goes once it was not written for `FORGET_AFTER`, `forget_stale`): a
request for a known agent nobody serves now ends at once with a 503 instead of waiting for
its deadline; a name never served is a 404.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field

import redis.asyncio as aredis
import structlog
from pydantic import BaseModel, Field, ValidationError

from hookbus.bus.connection.retrying import RECONNECT_ERRORS
from hookbus.bus.connection.values import text
from hookbus.bus.groups.periodic import cancel_and_wait, repeat
from hookbus.bus.groups.trim import FORGET_AFTER
from hookbus.bus.keys import Keys
from hookbus.skills import ServiceError

log = structlog.get_logger("hookbus.agents")

ORCHESTRATOR_TTL = 10.0
"""An orchestrator whose heartbeat is older than this is taken for dead."""
REFRESH_EVERY = 0.5
MAX_AGE = 1.0
"""An on-demand reader refreshes a view older than this before answering."""
AGENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""What an agent's name may be to be served by name: it is a key segment and the first part
of `<agent>/<model>`, so no `/`, `:`, braces or spaces."""


def check_agent_name(name: str) -> str:
    """`name` if an agent may be served under it; a ValueError that says why otherwise."""
    if not AGENT_NAME.fullmatch(name):
        raise ValueError(
            f"agent name {name!r} cannot be served by name: use 1 to 64 letters, digits, "
            "'.', '_' or '-', starting with a letter or digit"
        )
    return name


class AgentCard(BaseModel):
    """One agent as an orchestrator serving it announces it."""

    name: str = Field(description="How clients pick the agent: the OpenAI `model` field.")
    models: list[str] = Field(
        default_factory=list,
        description="Models a client may name as `<agent>/<model>` for this agent's LLM calls.",
    )


class ServedAgentsRecord(BaseModel):
    """An orchestrator's field in the `orchestrator-agents` hash."""

    agents: list[AgentCard] = Field(default_factory=list)
    seen: float = Field(default_factory=time.time, description="When the orchestrator last wrote it (unix seconds).")


def record_fields(instance: str, cards: list[AgentCard]) -> dict[str, str]:
    """The hash field an orchestrator writes beside each heartbeat."""
    return {instance: ServedAgentsRecord(agents=cards).model_dump_json()}


async def forget_stale(client: aredis.Redis, keys: Keys, forget_after: float = FORGET_AFTER) -> int:
    """Drop the records of orchestrators silent for `forget_after` (the janitor's round):
    their agents stop being known unless another orchestrator serves them."""
    records = await client.hgetall(keys.orchestrator_agents)
    cutoff = time.time() - forget_after
    stale = [instance for instance, raw in records.items() if _seen(raw) < cutoff]
    if stale:
        await client.hdel(keys.orchestrator_agents, *stale)
    return len(stale)


def _seen(raw: bytes | str) -> float:
    try:
        return ServedAgentsRecord.model_validate_json(raw).seen
    except ValidationError:
        return 0.0


@dataclass(frozen=True)
class ServedAgent:
    card: AgentCard
    orchestrators: tuple[str, ...] = ()
    """Live orchestrators serving it (empty: known, but nobody serves it now)."""

    @property
    def live(self) -> bool:
        return bool(self.orchestrators)


@dataclass(frozen=True)
class ServedAgents:
    """One reading of which agents exist and who serves them."""

    agents: dict[str, ServedAgent] = field(default_factory=dict)
    read_at: float = 0.0

    @property
    def live(self) -> list[str]:
        return sorted(name for name, agent in self.agents.items() if agent.live)

    def require(self, name: str, model: str | None = None) -> ServedAgent:
        """The agent, if an orchestrator serves it now (and it allows `model`); else the
        error a request for it ends with."""
        agent = self.agents.get(name)
        if agent is None or (model is not None and model not in agent.card.models):
            shown = name if model is None else f"{name}/{model}"
            raise ServiceError(404, "model_not_found", f"The model `{shown}` does not exist or you do not have access to it.")
        if not agent.live:
            raise ServiceError(503, "agent_unavailable", f"no orchestrator serves agent `{name}` now; try again later")
        return agent


def parse_served(beats: list[tuple[bytes | str, float]], records: dict[bytes | str, bytes | str], now: float) -> ServedAgents:
    """The view from the heartbeats (instance, time) and the hash of records; a record that
    does not decode counts as no agents (an orchestrator of another build)."""
    fresh = {text(instance) for instance, beat in beats if beat >= now - ORCHESTRATOR_TTL}
    cards: dict[str, AgentCard] = {}
    serving: dict[str, list[str]] = {}
    for raw_instance, raw in records.items():
        instance = text(raw_instance)
        try:
            record = ServedAgentsRecord.model_validate_json(raw)
        except ValidationError:
            log.warning("served_agents_record_unreadable", instance=instance)
            continue
        for card in record.agents:
            known = cards.setdefault(card.name, card)
            if card.models != known.models:  # two builds of one agent: a model either allows
                cards[card.name] = known.model_copy(update={"models": sorted({*known.models, *card.models})})
            if instance in fresh:
                serving.setdefault(card.name, []).append(instance)
    return ServedAgents(
        {name: ServedAgent(card, tuple(sorted(serving.get(name, ())))) for name, card in cards.items()},
        read_at=now,
    )


class AgentsView:
    """A cached `ServedAgents`: refreshed in the background once `start`ed (the gateway),
    else on demand when older than `max_age` (a client, a command)."""

    def __init__(self, client: aredis.Redis, keys: Keys, *, max_age: float = MAX_AGE) -> None:
        self.client = client
        self.keys = keys
        self.max_age = max_age
        self.current = ServedAgents()
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> ServedAgents:
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.zrange(self.keys.orchestrators, 0, -1, withscores=True)
            pipe.hgetall(self.keys.orchestrator_agents)
            beats, records = await pipe.execute()
        self.current = parse_served(beats, records, time.time())
        return self.current

    async def served(self) -> ServedAgents:
        """The view, refreshed first if it is older than `max_age` (never when the
        background refresh runs: it keeps it fresh). A Redis that does not answer leaves
        the last reading, and raises its error when there is none."""
        if self._task is None and time.time() - self.current.read_at > self.max_age:
            try:
                return await self.refresh()
            except RECONNECT_ERRORS as exc:
                if not self.current.read_at:
                    raise
                log.warning("served_agents_refresh_failed", error=str(exc))
        return self.current

    async def start(self) -> None:
        if self._task is None:
            try:
                await self.refresh()
            except RECONNECT_ERRORS as exc:
                log.warning("served_agents_refresh_failed", error=str(exc))
            self._task = asyncio.create_task(
                repeat(REFRESH_EVERY, self.refresh, what="served_agents_refresh"), name="hookbus-agents-view"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
