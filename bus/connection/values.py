"""Redis reply values as Python values: redis-py returns bytes and types them loosely."""

from __future__ import annotations

from typing import Any


def text(value: Any) -> str:
    """A reply value (bytes, str or number) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def text_or_none(value: Any) -> str | None:
    """`text(value)`, or None for a missing value (a nil reply, a missing hash field)."""
    return None if value is None else text(value)
