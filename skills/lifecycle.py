"""The lifecycle points of one agent request, in the order they fire.

Each point names the HookData fields a hook may change there; a hook that assigns any
other field gets an AttributeError naming the writable ones (the contract is in
DESIGN.md section 2, "HookData fields, by lifecycle").
"""

from __future__ import annotations

from typing import Literal, get_args

Lifecycle = Literal[
    "on_connection",
    "before_llm_call",
    "after_llm_call",
    "on_chunk",
    "before_toolcall",
    "after_toolcall",
    "on_message",
    "finalize_connection",
]

LIFECYCLES: tuple[str, ...] = get_args(Lifecycle)

WHEN: dict[str, str] = {
    "on_connection": "once, when a request arrives, before any LLM call; may refuse it (HookError).",
    "before_llm_call": "before every LLM call; changes to messages, tools and model_settings are what the LLM gets.",
    "after_llm_call": "after every LLM call, streaming or not; sees the assembled response and usage.",
    "on_chunk": "for every streamed chunk; rewrite its text, or set chunk to None to drop it; with a hold-back window, rewrite the held text.",
    "before_toolcall": "before each tool call, the client's too (client_tool); rewrite it, skip it with a result, or raise to block it.",
    "after_toolcall": "after each tool call (ran, skipped, blocked, failed or unknown); tool_result is what the model sees.",
    "on_message": "once, when the turn is complete, with the whole conversation.",
    "finalize_connection": "exactly once per request, on every path; error is set when the run failed.",
}

# Fields a hook may assign at each lifecycle point; everything else is read-only there.
WRITABLE: dict[str, frozenset[str]] = {
    "on_connection": frozenset({"messages", "stream"}),
    "before_llm_call": frozenset({"messages", "tools", "model_settings"}),
    "after_llm_call": frozenset({"response", "usage"}),
    "on_chunk": frozenset({"chunk", "content", "held"}),
    "before_toolcall": frozenset({"tool_call", "tool_skipped", "tool_result"}),
    "after_toolcall": frozenset({"tool_result"}),
    "on_message": frozenset({"messages"}),
    "finalize_connection": frozenset(),
}


def check_lifecycle(name: str) -> str:
    """Return `name` if it is a lifecycle point, else raise with the valid names listed."""
    if name not in LIFECYCLES:
        raise ValueError(
            f"unknown lifecycle {name!r}; valid lifecycles are: {', '.join(LIFECYCLES)}"
        )
    return name
