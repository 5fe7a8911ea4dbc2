"""The built-in skills, each in its own module; import paths like `hookbus.skills.builtin:RequestLogger`.

    from hookbus.skills.builtin import RequestLogger, SecuritySkill, ContentFilter
    agent = Agent("assistant", skills=[SecuritySkill(), ContentFilter(), RequestLogger()])

or host them in a worker group: `hookbus worker --group guard hookbus.skills.builtin:SecuritySkill`.
All of them are stateless across requests (per-request state lives in `ctx.state`) and
configurable by constructor keyword arguments or, for a worker that builds them with no
arguments, by environment variables (see each class's docstring).
"""

from hookbus.skills.builtin.analytics import AnalyticsSkill
from hookbus.skills.builtin.content_filter import ContentFilter
from hookbus.skills.builtin.memory import MemorySkill
from hookbus.skills.builtin.performance import PerformanceMonitor
from hookbus.skills.builtin.request_logger import RequestLogger
from hookbus.skills.builtin.security import SecuritySkill

__all__ = [
    "AnalyticsSkill",
    "ContentFilter",
    "MemorySkill",
    "PerformanceMonitor",
    "RequestLogger",
    "SecuritySkill",
]
