"""hookbus: an AI agent's request lifecycle as events on Redis Streams.

The public API, one import away:

    from hookbus import Skill, hook, tool, HookData, Context, HookError, Agent, HookbusClient

`HookError` is a hook's verdict; `ServiceError` what went wrong around the hooks (the bus,
the LLM endpoint, a cancellation); `HookbusError` is the base of both.

Everything else lives in the subpackages: `hookbus.skills` (the SDK and the built-in
skills), `hookbus.bus` (everything that touches Redis) and `hookbus.services` (the
orchestrator, the workers, the gateway and the `hookbus` command line).

The names are imported on first use: `hookbus health`, the probe every container runs every
few seconds, imports `hookbus.services.cli.health` and must not pay for the agent and the openai
client (seconds of imports on a busy host, enough to miss a probe's timeout).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hookbus.skills.lazy_names import lazy_names

if TYPE_CHECKING:
    from hookbus.bus.client import HookbusClient
    from hookbus.services.orchestrator.compaction.rules import CompactionPolicy
    from hookbus.services.orchestrator.loop.agent import Agent
    from hookbus.skills import (
        AuthInfo,
        Context,
        HookbusError,
        HookData,
        HookError,
        PaymentRequired,
        ServiceError,
        Skill,
        hook,
        tool,
    )
    from hookbus.skills.compaction_outcome import Compaction

_HOME = {
    "Agent": "hookbus.services.orchestrator.loop.agent",
    "AuthInfo": "hookbus.skills",
    "Compaction": "hookbus.skills.compaction_outcome",
    "CompactionPolicy": "hookbus.services.orchestrator.compaction.rules",
    "Context": "hookbus.skills",
    "HookData": "hookbus.skills",
    "HookError": "hookbus.skills",
    "HookbusError": "hookbus.skills",
    "ServiceError": "hookbus.skills",
    "HookbusClient": "hookbus.bus.client",
    "PaymentRequired": "hookbus.skills",
    "Skill": "hookbus.skills",
    "hook": "hookbus.skills",
    "tool": "hookbus.skills",
}

__all__ = [
    "Agent",
    "AuthInfo",
    "Compaction",
    "CompactionPolicy",
    "Context",
    "HookData",
    "HookError",
    "HookbusClient",
    "HookbusError",
    "PaymentRequired",
    "ServiceError",
    "Skill",
    "hook",
    "tool",
]


__getattr__, __dir__ = lazy_names(__name__, _HOME)
