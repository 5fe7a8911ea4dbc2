"""A package's public names imported on first use (PEP 562), for `hookbus` and `hookbus.skills`.

Importing a package runs its `__init__`; one that imports every public name eagerly makes
whoever needs one light module of it (the `hookbus health` probe, every few seconds in every
container) pay for all of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any


def lazy_names(
    package: str, home: Mapping[str, str], namespace: MutableMapping[str, Any], public: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package`: each name of `home` is imported from its
    module when first asked for, then kept in the package's `namespace`."""

    def getattr_(name: str) -> Any:
        module = home.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(public))

    return getattr_, dir_
