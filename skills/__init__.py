"""The hookbus skills SDK: everything a skill author imports.

    from skills import Skill, hook, tool, HookData, Context, HookError, PaymentRequired
"""

from skills.context import AuthInfo, Context, HookCall, Metadata, Session
from skills.data import HookData
from skills.decorators import hook, tool
from skills.errors import HookError, PaymentRequired
from skills.lifecycle import LIFECYCLES, Lifecycle
from skills.skill import Skill

__all__ = [
    "LIFECYCLES",
    "AuthInfo",
    "Context",
    "HookCall",
    "HookData",
    "HookError",
    "Lifecycle",
    "Metadata",
    "PaymentRequired",
    "Session",
    "Skill",
    "hook",
    "tool",
]
