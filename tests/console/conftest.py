"""A stack for the console's tests: embedded Redis, an orchestrator, the worker group `audit`
(two replicas, a hook on every lifecycle; one hook fails for scope `boom`) with a tool,
and a real gateway with keys in front; `standalone` is `hookbus console` with the same keys,
a process of its own.

Keys: ADMIN_KEY has the console's admin scope; USER_KEY is an ordinary caller; BOOM_KEY's
requests are aborted by a worker hook in before_llm_call; HOLD_KEY's wait in before_llm_call
until the test lets them go (the `hold` fixture's `release`), so they can be seen running.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from hookbus import Agent
from hookbus.bus.connection.embedded import free_port
from hookbus.services.console.access import ADMIN_SCOPE
from hookbus.skills import Context, HookData, HookError, Skill, hook
from tests.gateway.server import RunningGateway, running_gateway
from tests.integration.stack import Notes, running_stack
from tests.waiting import wait_for

ADMIN_KEY = "sk-test-console-admin"
USER_KEY = "sk-test-console-user"
BOOM_KEY = "sk-test-console-boom"
HOLD_KEY = "sk-test-console-hold"
API_KEYS: dict[str, Any] = {
    ADMIN_KEY: {"peer_user_id": "ops", "scopes": [ADMIN_SCOPE]},
    USER_KEY: {"peer_user_id": "alice", "scopes": []},
    BOOM_KEY: {"peer_user_id": "bob", "scopes": ["boom"]},
    HOLD_KEY: {"peer_user_id": "carol", "scopes": ["hold"]},
}
STAGE_ORDER = [
    "on_connection", "before_llm_call", "llm_call", "after_llm_call", "before_toolcall", "tool_call",
    "after_toolcall", "before_llm_call", "llm_call", "after_llm_call", "on_message", "finalize_connection",
]
"""The stage records of a request with one tool round, in the order they ran."""
TOOL_PROMPT = '[[tool:remember {"note": "milk"}]]'
FAILURE = "the compliance check is down"
SECRET = "my locker code is 4711"


class Audit(Skill):
    """A hook on every lifecycle but on_chunk; it changes nothing."""

    name = "audit"

    @hook("on_connection")
    def connected(self, data: HookData, ctx: Context) -> None: ...

    @hook("before_llm_call")
    def before_llm(self, data: HookData, ctx: Context) -> None: ...

    @hook("after_llm_call")
    def after_llm(self, data: HookData, ctx: Context) -> None: ...

    @hook("before_toolcall")
    def before_tool(self, data: HookData, ctx: Context) -> None: ...

    @hook("after_toolcall")
    def after_tool(self, data: HookData, ctx: Context) -> None: ...

    @hook("on_message")
    def answered(self, data: HookData, ctx: Context) -> None: ...

    @hook("finalize_connection")
    def finalized(self, data: HookData, ctx: Context) -> None: ...


class Compliance(Skill):
    name = "compliance"

    @hook("before_llm_call", 10, scope="boom")
    async def check(self, data: HookData, ctx: Context) -> HookData:
        raise HookError(503, "compliance_down", FAILURE)


class Hold(Skill):
    """Holds a request in before_llm_call until `release` is set (at most HOLD_LIMIT s)."""

    name = "hold"

    def __init__(self) -> None:
        self.release = asyncio.Event()

    @hook("before_llm_call", 20, scope="hold")
    async def wait(self, data: HookData, ctx: Context) -> None:
        await asyncio.wait_for(self.release.wait(), HOLD_LIMIT)


HOLD_LIMIT = 30.0


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def module_prefix() -> str:
    return f"co{uuid.uuid4().hex[:8]}:"


@pytest.fixture(scope="module")
def hold() -> Hold:
    """The stack's Hold (both replicas of `audit` share it)."""
    return Hold()


@pytest.fixture(scope="module")
async def stack(redis_url: str, module_prefix: str, hold: Hold) -> AsyncIterator[Any]:
    groups = {"audit": [Audit(), Compliance(), hold, Notes()]}
    async with running_stack(redis_url, module_prefix, Agent("console-test"), groups, replicas=2) as running:
        yield running


@pytest.fixture(scope="module")
async def gateway(stack: Any, redis_url: str, module_prefix: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(redis_url, module_prefix, api_keys=API_KEYS, models=["offline"]) as gw:
        yield gw


@dataclass(frozen=True)
class StandaloneConsole:
    """`hookbus console --api-keys FILE` running as a process."""

    url: str
    process: asyncio.subprocess.Process


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The gateway's keys as a keys file (`--api-keys FILE`)."""
    path = tmp_path_factory.mktemp("console-keys") / "keys.json"
    path.write_text(json.dumps(API_KEYS))
    return path


@pytest.fixture(scope="module")
async def standalone(stack: Any, redis_url: str, module_prefix: str, keys_file: Path) -> AsyncIterator[StandaloneConsole]:
    """The console without a gateway, as an operator starts it, with the gateway's keys."""
    port = free_port()
    env = dict(os.environ, REDIS_URL=redis_url, HOOKBUS_PREFIX=module_prefix, HOOKBUS_LOG_FORMAT="json")
    env.pop("HOOKBUS_API_KEYS", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hookbus.services.cli.main", "console", "--port", str(port),
        "--api-keys", str(keys_file), env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=5) as http:

            async def up() -> bool:
                try:
                    return (await http.get("/console/")).status_code == 200
                except httpx.TransportError:
                    return False

            assert await wait_for(up, timeout=30, every=0.2), "hookbus console did not start"
        yield StandaloneConsole(url, process)
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), timeout=15)


async def send(gateway: RunningGateway, key: str, text: str) -> tuple[str | None, int]:
    """One streamed chat completion: (its completion id, 200), or (None, the error's status)
    when it failed before streaming (an error response names no completion id)."""
    client = openai.AsyncOpenAI(base_url=gateway.v1, api_key=key, max_retries=0)
    completion_id = None
    try:
        stream = await client.chat.completions.create(
            model="offline", messages=[{"role": "user", "content": text}], stream=True
        )
        async for chunk in stream:
            completion_id = chunk.id
        return completion_id, 200
    except openai.APIStatusError as exc:
        return None, exc.status_code
    finally:
        await client.close()


async def dead_letter_a_request(stack: Any) -> str:
    """A request the orchestrator cannot read (its deadline is not a number), holding a
    secret prompt: it goes to the dead-letter stream. Returns its completion id."""
    client = stack[0]
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    envelope = {
        "v": 1, "kind": "request", "completion_id": completion_id,
        "messages": [{"role": "user", "content": SECRET}], "deadline": "soon",
    }
    await client.redis.xadd(client.keys.requests, {"e": json.dumps(envelope)})

    async def moved() -> bool:
        letters = await client.redis.xrange(client.keys.dead_letter)
        return any(completion_id.encode() in fields.get(b"original", b"") for _id, fields in letters)

    assert await wait_for(moved, timeout=10), "the unreadable request was not dead-lettered"
    return completion_id


