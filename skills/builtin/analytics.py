"""AnalyticsSkill: counts lifecycle events per request, and per model and agent overall."""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from typing import Any

from hookbus.skills.builtin._common import logger, read_section, state_section, sub_dict
from hookbus.skills.context import Context
from hookbus.skills.data import HookData
from hookbus.skills.decorators import hook
from hookbus.skills.skill import Skill

STATE_KEY = "analytics"
LOGGER_NAME = "hookbus.skills.analytics"


class AnalyticsSkill(Skill):
    """Counts what happens, per request and for the whole process.

    Every hook is an observer (`observe=True`): no request waits for the counting; the
    per-request counts are the observers' own state (blocking hooks of the request do
    not see them; hookbus.skills.observing).

    Per request, in `ctx.state["analytics"]`: `lifecycles` (how many times each lifecycle
    point fired for this request; `on_chunk` counts chunks), `model` and `agent` (from
    `ctx.metadata`). Every hook runs at priority 0 except `finalize_connection` (100).

    `finalize_connection` logs `request_analytics` with those counts and folds the request
    into this instance's aggregate counters, which `snapshot()` returns:
    `{"requests", "lifecycles", "models", "agents", "outcomes"}` (requests per model, per
    agent, per outcome "ok" or the error code). The aggregates are process-wide on
    purpose (they are not per-request state): a worker replica counts the requests it
    finalized; sum the replicas for a fleet view. They are guarded by a lock, so hooks
    running in threads or concurrent tasks update them safely, and a request is folded in
    only once even if its finalize is delivered twice to this process (the last
    `dedupe_window` completion ids are remembered).

    Configuration:
        dedupe_window: how many finalized completion ids to remember (default 10000).
    """

    name = "analytics"

    def __init__(self, *, dedupe_window: int = 10_000) -> None:
        self.dedupe_window = dedupe_window
        self._lock = threading.Lock()
        self._finalized: OrderedDict[str, None] = OrderedDict()
        self._requests = 0
        self._lifecycles: Counter[str] = Counter()
        self._models: Counter[str] = Counter()
        self._agents: Counter[str] = Counter()
        self._outcomes: Counter[str] = Counter()

    def count(self, data: HookData, ctx: Context) -> dict[str, Any]:
        """Count `data.lifecycle` for this request; returns the request's analytics state."""
        section = state_section(ctx, STATE_KEY)
        section.setdefault("model", ctx.metadata.model)
        section.setdefault("agent", ctx.metadata.agent_name)
        lifecycles = sub_dict(section, "lifecycles")
        lifecycles[data.lifecycle] = int(lifecycles.get(data.lifecycle, 0)) + 1
        return section

    @hook("on_connection", 0, observe=True)
    async def count_connection(self, data: HookData, ctx: Context) -> None:
        self.count(data, ctx)

    @hook("before_llm_call", 0, observe=True)
    async def count_before_llm(self, data: HookData, ctx: Context) -> None:
        self.count(data, ctx)

    @hook("after_llm_call", 0, observe=True)
    async def count_after_llm(self, data: HookData, ctx: Context) -> None:
        self.count(data, ctx)

    @hook("on_chunk", 0, observe=True)
    async def count_chunk(self, data: HookData, ctx: Context) -> None:
        self.count(data, ctx)

    @hook("before_toolcall", 0, observe=True)
    async def count_before_tool(self, data: HookData, ctx: Context) -> None:
        self.count(data, ctx)

    @hook("after_toolcall", 0, observe=True)
    async def count_after_tool(self, data: HookData, ctx: Context) -> None:
        self.count(data, ctx)

    @hook("on_message", 0, observe=True)
    async def count_message(self, data: HookData, ctx: Context) -> None:
        self.count(data, ctx)

    @hook("finalize_connection", 100, observe=True)
    async def record_request(self, data: HookData, ctx: Context) -> None:
        if read_section(ctx, STATE_KEY).get("finalized"):
            return  # this request state was finalized already
        section = self.count(data, ctx)
        outcome = "ok" if data.error is None else data.error.code
        lifecycles = {str(k): int(v) for k, v in section["lifecycles"].items()}
        model, agent = str(section.get("model") or ""), str(section.get("agent") or "")
        with self._lock:
            key = ctx.completion_id
            if key and key in self._finalized:
                fresh = False
            else:
                fresh = True
                if key:
                    self._finalized[key] = None
                    while len(self._finalized) > self.dedupe_window:
                        self._finalized.popitem(last=False)
                self._requests += 1
                self._lifecycles.update(lifecycles)
                self._models[model] += 1
                self._agents[agent] += 1
                self._outcomes[outcome] += 1
        section["finalized"] = True
        if fresh:
            logger(LOGGER_NAME, ctx).info(
                "request_analytics",
                model=model,
                agent=agent,
                outcome=outcome,
                lifecycles=lifecycles,
            )

    def snapshot(self) -> dict[str, Any]:
        """A copy of the aggregate counters (plain dicts, safe to serialize)."""
        with self._lock:
            return {
                "requests": self._requests,
                "lifecycles": dict(self._lifecycles),
                "models": dict(self._models),
                "agents": dict(self._agents),
                "outcomes": dict(self._outcomes),
            }

    def reset(self) -> None:
        """Zero the aggregate counters (the per-request state is untouched)."""
        with self._lock:
            self._finalized.clear()
            self._requests = 0
            for counter in (self._lifecycles, self._models, self._agents, self._outcomes):
                counter.clear()
