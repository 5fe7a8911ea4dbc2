"""The hookbus skills SDK: everything a skill author imports.

    from hookbus.skills import Skill, hook, tool, HookData, Context, HookError, PaymentRequired
"""

from hookbus.skills.context import AuthInfo, Context, HookCall, Metadata, Session
from hookbus.skills.data import HookData
from hookbus.skills.decorators import hook, tool
from hookbus.skills.errors import HookError, PaymentRequired
from hookbus.skills.lifecycle import LIFECYCLES, Lifecycle
from hookbus.skills.skill import Skill

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
