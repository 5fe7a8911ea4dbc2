"""The hookbus skills SDK: everything a skill author imports.

    from hookbus.skills import Skill, hook, tool, HookData, Context, HookError, PaymentRequired

The names are imported on first use, as `hookbus`'s own are: a module that needs only the
errors or the descriptors (the `hookbus health` probe, through the registry and the request
limits) must not pay for HookData's openai types, about a second of imports on a busy host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hookbus.skills.lazy_names import lazy_names

if TYPE_CHECKING:
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

_HOME = {
    "AuthInfo": "hookbus.skills.context",
    "Context": "hookbus.skills.context",
    "HookCall": "hookbus.skills.context",
    "Metadata": "hookbus.skills.context",
    "Session": "hookbus.skills.context",
    "HookData": "hookbus.skills.data",
    "hook": "hookbus.skills.decorators",
    "tool": "hookbus.skills.decorators",
    "BusUnavailable": "hookbus.skills.errors",
    "Cancelled": "hookbus.skills.errors",
    "ContextTooLong": "hookbus.skills.errors",
    "DeadlineExceeded": "hookbus.skills.errors",
    "DuplicateCompletionId": "hookbus.skills.errors",
    "GuardUnavailable": "hookbus.skills.errors",
    "HookbusError": "hookbus.skills.errors",
    "HookError": "hookbus.skills.errors",
    "OrchestratorLost": "hookbus.skills.errors",
    "PaymentRequired": "hookbus.skills.errors",
    "RedisOutOfMemory": "hookbus.skills.errors",
    "ServiceError": "hookbus.skills.errors",
    "UpstreamError": "hookbus.skills.errors",
    "LIFECYCLES": "hookbus.skills.lifecycle",
    "Lifecycle": "hookbus.skills.lifecycle",
    "ModelSettings": "hookbus.skills.model_settings",
    "Skill": "hookbus.skills.skill",
}

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


__getattr__, __dir__ = lazy_names('hookbus.skills', _HOME, globals(), __all__)
