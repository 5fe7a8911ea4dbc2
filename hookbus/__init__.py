"""hookbus: an AI agent's request lifecycle as events on Redis Streams.

The public API, one import away:

    from hookbus import Skill, hook, tool, HookData, Context, HookError, Agent, HookbusClient

Everything else lives in the subpackages: `hookbus.skills` (the SDK and the built-in
skills), `hookbus.bus` (everything that touches Redis) and `hookbus.services` (the
orchestrator, the workers, the gateway and the `hookbus` command line).
"""

from hookbus.bus.client import HookbusClient
from hookbus.services.orchestrator.agent import Agent
from hookbus.services.orchestrator.compaction import Compaction, CompactionPolicy
from hookbus.skills import (
    AuthInfo,
    Context,
    HookData,
    HookError,
    PaymentRequired,
    Skill,
    hook,
    tool,
)

__all__ = [
    "Agent",
    "AuthInfo",
    "Compaction",
    "CompactionPolicy",
    "Context",
    "HookData",
    "HookError",
    "HookbusClient",
    "PaymentRequired",
    "Skill",
    "hook",
    "tool",
]
