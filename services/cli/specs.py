"""Resolving `pkg.module:attribute` specs from the command line into skills and agents."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

from hookbus.services.orchestrator.loop.agent import Agent
from hookbus.skills import Skill


class SpecError(ValueError):
    """A `pkg.module:attribute` spec that does not resolve to what the command needs."""


def resolve(spec: str) -> Any:
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise SpecError(f"{spec!r} is not of the form pkg.module:attribute")
    try:
        module = _import_from_here(module_name)
    except (ImportError, ValueError) as exc:  # ValueError: a name find_spec refuses (".x")
        raise SpecError(
            f"cannot import {module_name!r} for {spec!r}: {exc}. The module must be installed, in the "
            f"current folder ({os.getcwd()}) or under a folder named in PYTHONPATH"
        ) from exc
    try:
        return getattr(module, attribute)
    except AttributeError as exc:
        raise SpecError(f"module {module_name!r} has no attribute {attribute!r}") from exc


def _import_from_here(module_name: str) -> Any:
    """The module, found in the current folder too, as `python -m` finds it: a console
    script's `sys.path` starts at its own folder (`.venv/bin`), so a newcomer's
    `mymodule.py` beside them was not found. The folder joins the path only when the
    module's top package is found nowhere else, and last, so a file there never shadows
    an installed package the service imports later (a stray `redis.py`)."""
    top = module_name.partition(".")[0]
    here = os.getcwd()
    if importlib.util.find_spec(top) is None and here not in sys.path:
        sys.path.append(here)
    return importlib.import_module(module_name)


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
