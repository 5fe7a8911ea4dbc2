"""Two real stacks behind a real gateway, for the compatibility tests of real client libraries.

- `offline_gateway`: the built-in offline model; the agent has instructions, a server tool
  `add` (in-process) and a `Guard` that blocks the client tool `forbidden` and rewrites
  client calls whose arguments say "rewrite-me" (before_toolcall sees client calls).
- `upstream_gateway`: a recording upstream (tests/compat/upstream.py) as the LLM; the agent
  has instructions, default and pinned model settings, a server tool `add`, and a `Tuner`
  in a worker group that changes the temperature in before_llm_call.
Auth is off on both gateways (the compatibility in question is the wire format).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from hookbus import Agent, Context, HookData, Skill, hook, tool
from hookbus.services.orchestrator.llm.client import LLM
from tests.compat.upstream import RecordingUpstream
from tests.gateway.server import RunningGateway, running_gateway
from tests.integration.stack import running_stack

AGENT_RULES = "AGENT RULES: be exact."
UPSTREAM_MODEL = "upstream-model"
AGENT_DEFAULTS = {"top_p": 0.5, "presence_penalty": 0.1}
AGENT_PINS = {"max_tokens": 100}


def function_tool(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The client's {name}.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }


TWO_LOOKUPS = '[[tool:lookup {"q": "a"}]] [[tool:lookup {"q": "b"}]]'
TOOL_CHOICE_CASES = pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "other"}}}, ["other"]),
        ({"tool_choice": "none"}, []),
        ({"tool_choice": {"type": "allowed_tools", "allowed_tools": {
            "mode": "required", "tools": [{"type": "function", "function": {"name": "other"}}]}}}, ["other"]),
        ({}, ["lookup", "lookup"]),
        ({"parallel_tool_calls": False}, ["lookup"]),
    ],
)
"""tool_choice and parallel_tool_calls against the offline model, offered the client tools
`lookup` and `other`: the request's `options` and the names of the calls expected back."""


def tool_choice_prompt(options: dict[str, Any]) -> str:
    """What the offline model is asked in a TOOL_CHOICE_CASES case: two lookups unless a
    tool_choice decides, which must then decide alone (a prompt with no directive)."""
    return "no directive" if "tool_choice" in options else TWO_LOOKUPS


class Calc(Skill):
    name = "calc"

    @tool
    def add(self, a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: The first.
            b: The second.
        """
        return a + b


class Guard(Skill):
    name = "guard"

    @hook("before_toolcall", 5)
    async def check(self, data: HookData, ctx: Context) -> HookData | None:
        assert data.tool_call is not None
        function = data.tool_call["function"]
        if data.client_tool and function["name"] == "forbidden":
            raise PermissionError("the client tool forbidden is not allowed here")
        if data.client_tool and "rewrite-me" in function["arguments"]:
            data.tool_call = {**data.tool_call, "function": {**function, "arguments": json.dumps({"q": "rewritten"})}}
            return data
        return None


class Tuner(Skill):
    """Reads the call's settings and changes one: temperature 1.5 becomes 0.25."""

    name = "tuner"

    @hook("before_llm_call")
    async def tune(self, data: HookData, ctx: Context) -> HookData | None:
        if data.model_settings is not None and data.model_settings.temperature == 1.5:
            data.model_settings = data.model_settings.model_copy(update={"temperature": 0.25})
            return data
        return None


@pytest.fixture(scope="module")
def module_prefix() -> str:
    return f"compat{uuid.uuid4().hex[:8]}:"


@pytest.fixture(scope="module")
async def offline_gateway(redis_url: str, module_prefix: str) -> AsyncIterator[RunningGateway]:
    agent = Agent("compat", instructions=AGENT_RULES, skills=[Calc(), Guard()])
    async with running_stack(redis_url, module_prefix, agent), running_gateway(
        redis_url, module_prefix, models=["offline"]
    ) as gw:
        yield gw


@pytest.fixture(scope="module")
def upstream() -> Iterator[RecordingUpstream]:
    with RecordingUpstream() as server:
        yield server


@pytest.fixture
def recording(upstream: RecordingUpstream) -> RecordingUpstream:
    upstream.reset()
    return upstream


@pytest.fixture(scope="module")
async def upstream_gateway(
    redis_url: str, upstream: RecordingUpstream
) -> AsyncIterator[RunningGateway]:
    prefix = f"up{uuid.uuid4().hex[:8]}:"
    agent = Agent(
        "upstream", model=UPSTREAM_MODEL, instructions=AGENT_RULES, skills=[Calc()],
        llm=LLM(base_url=upstream.url, api_key="sk-upstream", timeout=2.0, retries=1),
        model_settings=AGENT_DEFAULTS, pinned_settings=AGENT_PINS,
    )
    async with running_stack(redis_url, prefix, agent, {"tuning": [Tuner()]}), running_gateway(
        redis_url, prefix, models=[UPSTREAM_MODEL]
    ) as gw:
        yield gw
