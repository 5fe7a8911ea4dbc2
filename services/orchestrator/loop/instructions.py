"""The agent's instructions and a client's system text, in one system message.

A client's own system message used to replace the agent's instructions, so any caller
could talk an agent out of its rules. Now the agent's instructions always come first and
the client's leading system (or developer) text follows them, in the same message: one
system message at the start is the one form every chat template accepts (some local
models' templates refuse a second system message).
"""

from __future__ import annotations

from typing import Any

SYSTEM_ROLES = frozenset({"system", "developer"})


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    return ""


def with_instructions(instructions: str, conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`conversation` with one system message first: `instructions`, then the client's
    leading system/developer texts (blank-line separated); the rest is unchanged.

    A conversation that already starts with the instructions (one this agent built, sent
    back) is not given them twice."""
    leading = 0
    while leading < len(conversation) and conversation[leading].get("role") in SYSTEM_ROLES:
        leading += 1
    texts = [t for m in conversation[:leading] if (t := _text(m.get("content")))]
    if not (texts and texts[0].startswith(instructions)):
        texts.insert(0, instructions)
    return [{"role": "system", "content": "\n\n".join(texts)}, *conversation[leading:]]
