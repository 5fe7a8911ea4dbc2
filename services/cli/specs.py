"""Resolving `pkg.module:attribute` specs from the command line into skills and agents."""

from __future__ import annotations

import importlib
from typing import Any

from hookbus.services.orchestrator.agent import Agent
from hookbus.skills import Skill


class SpecError(ValueError):
    """A `pkg.module:attribute` spec that does not resolve to what the command needs."""


def resolve(spec: str) -> Any:
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise SpecError(f"{spec!r} is not of the form pkg.module:attribute")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(f"cannot import {module_name!r} for {spec!r}: {exc}") from exc
    try:
        return getattr(module, attribute)
    except AttributeError as exc:
        raise SpecError(f"module {module_name!r} has no attribute {attribute!r}") from exc


def load_skill(spec: str) -> Skill:
    """A Skill subclass (instantiated with no arguments) or a Skill instance."""
    target = resolve(spec)
    if isinstance(target, type) and issubclass(target, Skill):
        return target()
    if isinstance(target, Skill):
        return target
    raise SpecError(f"{spec!r} is {type(target).__name__}, not a Skill class or instance")


def load_agent(spec: str) -> Agent:
    """An Agent instance, or a callable with no arguments that returns one."""
    target = resolve(spec)
    if callable(target) and not isinstance(target, Agent):
        target = target()
    if not isinstance(target, Agent):
        raise SpecError(f"{spec!r} is {type(target).__name__}, not an Agent")
    return target
