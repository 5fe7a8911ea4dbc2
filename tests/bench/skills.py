"""Skills and agents the benchmarks run, in-process or in `hookbus worker` / `hookbus
orchestrator` subprocesses (they load them as `tests.bench.skills:Name`).

Every hook here is a no-op (returns None: "unchanged") unless its name says otherwise.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hookbus import Agent
from hookbus.services.orchestrator.llm.client import LLM
from hookbus.skills import Context, HookData, Skill, hook, tool
from hookbus.skills.lifecycle import LIFECYCLES

NON_CHUNK = [lc for lc in LIFECYCLES if lc != "on_chunk"]


def _noop_hooks(
    namespace: dict[str, Any], lifecycles: list[str], priority: int, tag: str, observe: frozenset[str] = frozenset()
) -> None:
    """A no-op hook per lifecycle; those in `observe` are declared observers."""
    for lifecycle in lifecycles:
        async def noop(self: Skill, data: HookData, ctx: Context) -> HookData | None:  # noqa: ARG001
            return None

        noop.__name__ = f"{tag}_{lifecycle}"
        namespace[noop.__name__] = hook(lifecycle, priority, observe=lifecycle in observe)(noop)


# --------------------------------------------------------------- one hop (hop bench)


class HopNoop(Skill):
    """One no-op hook on the two lifecycles the hop bench drives."""

    name = "hop-noop"

    @hook("on_chunk", 10)
    async def chunk(self, data: HookData, ctx: Context) -> None:
        return None

    @hook("before_llm_call", 10)
    async def before(self, data: HookData, ctx: Context) -> None:
        return None


# ------------------------------------------------------- a chain of three (peer bench)


class Chain1(Skill):
    name = "chain-1"

    @hook("before_llm_call", 10)
    async def first(self, data: HookData, ctx: Context) -> None:
        return None


class Chain2(Skill):
    name = "chain-2"

    @hook("before_llm_call", 20)
    async def second(self, data: HookData, ctx: Context) -> None:
        return None


class Chain3(Skill):
    name = "chain-3"

    @hook("before_llm_call", 30)
    async def third(self, data: HookData, ctx: Context) -> None:
        return None


# ---------------------------------------------------- full request: 3 hooks, 2 groups

_alpha: dict[str, Any] = {"name": "bench-alpha"}
_noop_hooks(_alpha, NON_CHUNK, 10, "a1")
_noop_hooks(_alpha, NON_CHUNK, 20, "a2")
Alpha = type("Alpha", (Skill,), _alpha)
"""Two no-op hooks on every lifecycle but on_chunk (priorities 10 and 20: one hop)."""

_beta: dict[str, Any] = {"name": "bench-beta"}
_noop_hooks(_beta, NON_CHUNK, 30, "b1")
Beta = type("Beta", (Skill,), _beta)
"""One no-op hook on every lifecycle but on_chunk (priority 30: a second hop)."""


class Lookup(Skill):
    """An in-process tool, so a request goes through before/after_toolcall too."""

    name = "bench-lookup"

    @tool
    async def lookup(self, key: str = "x") -> str:
        """Look a key up.

        Args:
            key: what to look up
        """
        return f"value of {key}"


FULL_PROMPT = "Look it up. [[tool:lookup {\"key\": \"k\"}]]"
"""The offline model calls `lookup` once, then answers: 2 LLM calls, every non-chunk stage."""


def full_agent() -> Agent:
    """The agent of the full-request bench on the bus (hooks live in worker groups)."""
    return Agent("bench-full", instructions="You are a benchmark.", skills=[Lookup()])


def full_agent_inprocess(llm: LLM | None = None) -> Agent:
    """The same agent with the same three hooks per stage in-process (the baseline)."""
    return Agent("bench-full", instructions="You are a benchmark.", skills=[Lookup(), Alpha(), Beta()], llm=llm)


# -------------------------------------------------------------------------- streaming


class ChunkNoop(Skill):
    """One remote no-op on_chunk hook, only for callers with scope "chunky"."""

    name = "chunk-noop"

    @hook("on_chunk", 10, scope="chunky")
    async def chunk(self, data: HookData, ctx: Context) -> None:
        return None


class ChunkReader(Skill):
    """One remote on_chunk hook that reads the text so far (as a filter of the whole answer
    would), only for callers with scope "chunky"."""

    name = "chunk-reader"

    @hook("on_chunk", 10, scope="chunky")
    async def chunk(self, data: HookData, ctx: Context) -> None:
        if not (data.full_content or "").endswith(data.content or ""):
            raise ValueError(f"chunk {data.chunk_index}: its text is not the end of the text so far")


STREAM_PROMPT = "[[words:500]]"


def stream_agent() -> Agent:
    """The default: remote on_chunk hops batched (Agent.chunk_batch)."""
    return Agent("bench-stream")


def sequential_stream_agent() -> Agent:
    """One on_chunk hop per chunk (`chunk_batch=1`), the baseline of batching."""
    return Agent("bench-stream-sequential", chunk_batch=1)


# --------------------------------------------------------------------------- scale-out


class Sleeper(Skill):
    """An I/O-bound hook: waits 20 ms."""

    name = "sleeper"

    @hook("on_chunk", 10)
    async def wait(self, data: HookData, ctx: Context) -> None:
        await asyncio.sleep(0.02)


# ------------------------------------------------------------- cost of one request

_policy: dict[str, Any] = {"name": "cost-policy"}
_noop_hooks(_policy, list(LIFECYCLES), 10, "p")
CostPolicy = type("CostPolicy", (Skill,), _policy)
"""Group `policy`: a no-op hook on every lifecycle, on_chunk included (as the built-in
skills together have)."""

_audit: dict[str, Any] = {"name": "cost-audit"}
_noop_hooks(_audit, ["on_connection", "before_toolcall", "finalize_connection"], 20, "a")
CostAudit = type("CostAudit", (Skill,), _audit)
"""Group `audit`: a credit check, a tool guard and the charge at the end (after policy's)."""

WATCHING = frozenset({"after_llm_call", "on_chunk", "after_toolcall", "on_message", "finalize_connection"})
"""The cost mix's hooks that only watch (log, count, time, charge at the end): with
observers, these are declared `observe=True`; the checks (on_connection, before_llm_call,
before_toolcall) stay on the request's path."""

_policy_observed: dict[str, Any] = {"name": "cost-policy"}
_noop_hooks(_policy_observed, list(LIFECYCLES), 10, "p", WATCHING)
CostPolicyObserved = type("CostPolicyObserved", (Skill,), _policy_observed)
"""CostPolicy with its watching hooks declared observers."""

_audit_observed: dict[str, Any] = {"name": "cost-audit"}
_noop_hooks(_audit_observed, ["on_connection", "before_toolcall", "finalize_connection"], 20, "a", WATCHING)
CostAuditObserved = type("CostAuditObserved", (Skill,), _audit_observed)
"""CostAudit with its charge at the end (finalize_connection) declared an observer."""

_policy_checks: dict[str, Any] = {"name": "cost-policy"}
_noop_hooks(_policy_checks, [lc for lc in LIFECYCLES if lc not in WATCHING], 10, "p")
CostPolicyChecks = type("CostPolicyChecks", (Skill,), _policy_checks)
"""CostPolicy without its watching hooks: what the mix costs with no watching at all,
the floor of any way of running them."""

_audit_checks: dict[str, Any] = {"name": "cost-audit"}
_noop_hooks(_audit_checks, ["on_connection", "before_toolcall"], 20, "a")
CostAuditChecks = type("CostAuditChecks", (Skill,), _audit_checks)
"""CostAudit without its charge at the end."""

_watch_only: dict[str, Any] = {"name": "watch-only"}
_noop_hooks(_watch_only, list(LIFECYCLES), 10, "w", frozenset(LIFECYCLES))
WatchOnly = type("WatchOnly", (Skill,), _watch_only)
"""An observer on every lifecycle, on_chunk included: a group that only watches."""

COST_ANSWER_WORDS = 16


class CostLookup(Skill):
    """The request's one in-process tool; its result makes the model's answer 20 words."""

    name = "cost-lookup"

    @tool
    async def lookup(self, key: str = "x") -> str:
        """Look a key up.

        Args:
            key: what to look up
        """
        return " ".join(f"{key}{n}" for n in range(COST_ANSWER_WORDS))


COST_PROMPT = "Look it up. [[tool:lookup {\"key\": \"k\"}]]"
"""One tool round, then the answer "The tool lookup returned: k0 ... k15" (20 text chunks)."""


def cost_agent() -> Agent:
    return Agent("bench-cost", instructions="You are a benchmark.", skills=[CostLookup()])
