"""The hookbus skills SDK: everything a skill author imports.

    from hookbus.skills import Skill, hook, tool, HookData, Context, HookError, PaymentRequired
"""

from hookbus.skills.context import AuthInfo, Context, HookCall, Metadata, Session
from hookbus.skills.data import HookData
from hookbus.skills.decorators import hook, tool
from hookbus.skills.errors import (
    BusUnavailable,
    Cancelled,
    ContextTooLong,
    DeadlineExceeded,
    DuplicateCompletionId,
    GuardUnavailable,
    HookbusError,
    HookError,
    OrchestratorLost,
    PaymentRequired,
    RedisOutOfMemory,
    ServiceError,
    UpstreamError,
)
from hookbus.skills.lifecycle import LIFECYCLES, Lifecycle
from hookbus.skills.model_settings import ModelSettings
from hookbus.skills.skill import Skill

__all__ = [
    "LIFECYCLES",
    "AuthInfo",
    "BusUnavailable",
    "Cancelled",
    "ContextTooLong",
    "Context",
    "DeadlineExceeded",
    "DuplicateCompletionId",
    "GuardUnavailable",
    "HookCall",
    "HookData",
    "HookError",
    "HookbusError",
    "Lifecycle",
    "Metadata",
    "ModelSettings",
    "OrchestratorLost",
    "PaymentRequired",
    "RedisOutOfMemory",
    "ServiceError",
    "Session",
    "Skill",
    "UpstreamError",
    "hook",
    "tool",
]
