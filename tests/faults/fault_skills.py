"""Skills and an agent for the fault tests, loaded by `hookbus worker` / `hookbus
orchestrator` subprocesses (`tests.faults.fault_skills:Slow`, `...:agent`).

They record what happened in Redis under `{HOOKBUS_PREFIX}test:...`, so the test can
see it after the process that did it was killed. `HOOKBUS_TEST_NAME` is the replica or
instance name (set by tests/integration/processes.py).

Directives in the last user message steer them: `hold=SECONDS` (Slow sleeps in
on_connection), `holdfirst` (only on the first delivery), `poison` (Poison kills its
process with os._exit(1) on every delivery), `payhold=SECONDS` (how long the tool `pay`
holds after its side effect; 0.3 s without it).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

import redis.asyncio as aredis

from hookbus import Agent
from hookbus.skills import Context, HookData, Skill, hook, tool

NAME = os.environ.get("HOOKBUS_TEST_NAME", f"pid{os.getpid()}")
_clients: dict[int, aredis.Redis] = {}


def fault_key(*parts: str, prefix: str | None = None) -> str:
    return f"{prefix or os.environ.get('HOOKBUS_PREFIX', 'hookbus:')}test:" + ":".join(parts)


def redis_client() -> aredis.Redis:
    """One client per event loop of this process."""
    loop = asyncio.get_running_loop()
    client = _clients.get(id(loop))
    if client is None:
        client = _clients[id(loop)] = aredis.Redis.from_url(os.environ["REDIS_URL"])
    return client


def user_text(messages: list[dict[str, Any]] | None) -> str:
    for message in reversed(messages or []):
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            return message["content"]
    return ""


def param(text: str, name: str, default: float = 0.0) -> float:
    match = re.search(rf"\b{name}=([0-9.]+)", text)
    return float(match.group(1)) if match else default


class Slow(Skill):
    """Records every delivery (replica, attempt, idempotency key), then maybe holds."""

    name = "slow"

    @hook("on_connection", 10)
    async def hold(self, data: HookData, ctx: Context) -> HookData:
        text = user_text(data.messages)
        await redis_client().rpush(
            fault_key("runs", ctx.completion_id),
            json.dumps({
                "by": NAME, "attempt": ctx.call.attempt, "key": ctx.call.idempotency_key,
                "marked": ctx.state.get("marked"),
            }),
        )
        ctx.state["slow_replica"] = NAME
        seconds = param(text, "hold")
        if seconds and ("holdfirst" not in text or ctx.call.attempt == 1):
            await asyncio.sleep(seconds)  # the point: a hook that holds its hop
        return data


class Mark(Skill):
    """Runs before Slow (in a group of its own, so the stage is sent on from it to Slow's
    group): marks the state and the message."""

    name = "mark"

    @hook("on_connection", 5)
    async def mark(self, data: HookData, ctx: Context) -> HookData:
        ctx.state["marked"] = NAME
        last = data.messages[-1]
        data.messages[-1] = {**last, "content": f"{last['content']} (marked)"}
        return data


class Poison(Skill):
    """Crashes its worker process on every delivery of a request that says `poison`."""

    name = "poison"

    @hook("on_connection", 20)
    async def explode(self, data: HookData, ctx: Context) -> HookData:
        if "poison" in user_text(data.messages):
            await redis_client().rpush(fault_key("poisoned", ctx.completion_id), NAME)
            os._exit(1)
        return data


class _Counter(Skill):
    counter = "finalize"

    async def _count(self, data: HookData, ctx: Context) -> HookData:
        record = {
            "by": NAME,
            "recovery": ctx.recovery,
            "error": data.error.status_code if data.error else None,
            "code": data.error.code if data.error else None,
        }
        async with redis_client().pipeline(transaction=False) as pipe:
            pipe.incr(fault_key(self.counter, ctx.completion_id))
            pipe.rpush(fault_key(f"{self.counter}-log", ctx.completion_id), json.dumps(record))
            await pipe.execute()
        return data


class Ledger(_Counter):
    """Worker-hosted: counts finalize_connection runs per request (`test:wfinalize:{cid}`)."""

    name = "ledger"
    counter = "wfinalize"

    @hook("finalize_connection")
    async def count(self, data: HookData, ctx: Context) -> HookData:
        return await self._count(data, ctx)


class LocalLedger(_Counter):
    """In the orchestrator: counts finalize_connection runs per request (`test:finalize:{cid}`)."""

    name = "local-ledger"
    counter = "finalize"

    @hook("finalize_connection", 90)
    async def count(self, data: HookData, ctx: Context) -> HookData:
        return await self._count(data, ctx)


class Touch(Skill):
    """Cheap hooks at several lifecycle points, so a request makes several hops."""

    name = "touch"

    @hook("on_connection", 30)
    async def connect(self, data: HookData, ctx: Context) -> HookData:
        ctx.state.setdefault("touched", []).append(f"{NAME}:on_connection")
        return data

    @hook("after_llm_call", 30)
    async def answered(self, data: HookData, ctx: Context) -> HookData:
        ctx.state.setdefault("touched", []).append(f"{NAME}:after_llm_call")
        return data


class Stamp(Skill):
    """Cheap hooks for a second group."""

    name = "stamp"

    @hook("before_llm_call", 30)
    async def before(self, data: HookData, ctx: Context) -> HookData:
        ctx.state["stamped"] = NAME
        return data

    @hook("on_message", 30)
    async def message(self, data: HookData, ctx: Context) -> HookData:
        ctx.state["messaged"] = NAME
        return data


PAY_ONCE = """redis.call('RPUSH', KEYS[1], ARGV[1])
if redis.call('SET', KEYS[2], '1', 'NX') then redis.call('RPUSH', KEYS[3], ARGV[2]) end"""
"""The payment provider's side, one round trip: the call logged, then a payment for a key
not seen before (standalone Redis)."""


class Payments(Skill):
    """In the orchestrator: a tool with a side effect, done once per idempotency key.

    Each call is logged (`test:pay-calls:{cid}`: who ran it, with which key); the side
    effect (`test:pay-effects:{cid}`, one key per payment made) happens only for a key
    not seen before, as a payment provider honouring idempotency keys would. A tool call
    run again with its own key makes no second payment; one run again under a new key
    (a repeated LLM call's new call id, or a key that is not the call's) makes one."""

    name = "payments"

    @tool
    async def pay(self, n: int, ctx: Context) -> str:
        """Pay installment n."""
        client = redis_client()
        key = ctx.call.idempotency_key
        # one script: a SIGKILL between taking the key and recording the payment would
        # leave a key taken and no payment, which a rerun under that key never makes
        await client.eval(
            PAY_ONCE, 3, fault_key("pay-calls", ctx.completion_id), fault_key("paid", key),
            fault_key("pay-effects", ctx.completion_id), json.dumps({"by": NAME, "key": key}), key,
        )
        await asyncio.sleep(param(ctx.state.get("user_text", ""), "payhold", 0.3))
        return f"paid {n}"


class UserText(Skill):
    """In the orchestrator: keeps the request's user text in `ctx.state` for its tools."""

    name = "user-text"

    @hook("on_connection", 1)
    async def keep(self, data: HookData, ctx: Context) -> HookData:
        ctx.state["user_text"] = user_text(data.messages)
        return data


RESUME_ROUNDS = 3
"""Tool rounds of `resume_agent`: a `[[loop:pay]]` request pays three times, then answers."""


def make_agent() -> Agent:
    return Agent("faults", skills=[LocalLedger()])


def plain_agent() -> Agent:
    """No skill: no hook runs at any stage, so a run records no step before its LLM call."""
    return Agent("faults")


def resume_agent() -> Agent:
    """The agent of the resumed-run tests: a paying tool, finalize counted in-process."""
    return Agent("faults", skills=[LocalLedger(), UserText(), Payments()], max_tool_rounds=RESUME_ROUNDS)


agent = make_agent
