"""Names a package exports but imports on first use, each from its own module.

`hookbus`, `hookbus.skills`, `hookbus.services.gateway` and
`hookbus.services.orchestrator.serving` export names whose modules are heavy (the agent,
the openai client's types, Starlette, the broker); a process that needs one light name of
the package (a command line call, a health probe) must not pay for the others.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, home: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level `__getattr__` and `__dir__` of `package` (its `__name__`) for the
    names in `home` (name -> the module that defines it): a name is imported when first
    asked for, then kept in the package like any attribute."""
    module = sys.modules[package]

    def __getattr__(name: str) -> Any:
        where = home.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where), name)
        setattr(module, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(module)) | set(home))

    return __getattr__, __dir__
