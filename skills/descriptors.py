"""What a hook or a tool is, in one type each: written by the decorators, completed with its
skill when a skill is bound, announced by a worker group as is, and planned by the
orchestrator as is (with where it runs beside it).

These are pydantic models because they cross the bus in a group's announcement.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hookbus.skills.lifecycle import Lifecycle


class HookDescriptor(BaseModel):
    """One hook: which skill method, on which lifecycle, and how it is run.

    `skill` and `method` are empty on the decorated function and filled in when a skill
    instance is bound (the skill's name may be set per instance)."""

    model_config = ConfigDict(frozen=True)

    skill: str = ""
    method: str = ""
    lifecycle: Lifecycle
    priority: int
    scope: str = "all"
    timeout: float | None = None
    critical: bool = False
    guard: bool = False
    observe: bool = False
    """An observer: gets the stage's data as the stage ended, off the request's path
    (hookbus.skills.observing); never changes data, never aborts."""
    hold_back: int = 0
    """on_chunk only: characters of the model's text held back from the client until this
    hook judged the text that follows them (hookbus.services.orchestrator.streaming.hold_back)."""

    @property
    def key(self) -> str:
        return f"{self.skill}.{self.method}"


class ToolDescriptor(BaseModel):
    """One tool: its skill, its name and the OpenAI function tool schema the model sees."""

    model_config = ConfigDict(frozen=True)

    skill: str = ""
    name: str
    parameters_schema: dict[str, Any] = Field(description="The OpenAI function tool schema.")
    scope: str = "all"
    timeout: float | None = None
