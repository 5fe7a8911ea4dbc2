"""The function tool the OpenAI Agents SDK tests give the SDK (Chat Completions and
Responses API alike): it records what it was asked, so a test sees the SDK ran it."""

from __future__ import annotations

from agents import function_tool, set_tracing_disabled

set_tracing_disabled(True)  # no network: the SDK's tracing exporter would try to reach OpenAI
LOOKED_UP: list[str] = []


@function_tool
def lookup(q: str) -> str:
    """Look something up.

    Args:
        q: What to look up.
    """
    LOOKED_UP.append(q)
    return f"found {q}"
