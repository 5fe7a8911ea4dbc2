"""The lifecycle points of one agent request, in the order they fire, and `on_compaction`.

`Lifecycle` is a `StrEnum`: every member is the plain string it names, so `@hook("on_chunk")`
and `@hook(Lifecycle.ON_CHUNK)` are the same hook, and the wire carries the same strings.
Each point names the HookData fields a hook may change there; a hook that assigns any other
field gets an AttributeError naming the writable ones.
"""

from __future__ import annotations

import enum


class Lifecycle(enum.StrEnum):
    """Where a hook runs. The request's points fire in this order; `on_compaction` fires
    whenever a compaction changed the conversation (inside a request or between turns)."""

    ON_CONNECTION = "on_connection"
    BEFORE_LLM_CALL = "before_llm_call"
    AFTER_LLM_CALL = "after_llm_call"
    ON_CHUNK = "on_chunk"
    BEFORE_TOOLCALL = "before_toolcall"
    AFTER_TOOLCALL = "after_toolcall"
    ON_MESSAGE = "on_message"
    FINALIZE_CONNECTION = "finalize_connection"
    ON_COMPACTION = "on_compaction"


LIFECYCLES: tuple[str, ...] = tuple(point.value for point in Lifecycle)

WHEN: dict[Lifecycle, str] = {
    Lifecycle.ON_CONNECTION: "once, when a request arrives, before any LLM call; may refuse it (HookError).",
    Lifecycle.BEFORE_LLM_CALL: "before every LLM call; changes to messages, tools and model_settings are what the LLM gets.",
    Lifecycle.AFTER_LLM_CALL: "after every LLM call, streaming or not; sees the assembled response and usage.",
    Lifecycle.ON_CHUNK: "for every streamed chunk; rewrite its text, or set chunk to None to drop it; with a hold-back window, rewrite the held text.",
    Lifecycle.BEFORE_TOOLCALL: "before each tool call, the client's too (client_tool); rewrite it, skip it with a result, or raise to block it.",
    Lifecycle.AFTER_TOOLCALL: "after each tool call (ran, skipped, blocked, failed or unknown); tool_result is what the model sees.",
    Lifecycle.ON_MESSAGE: "once, when the turn is complete, with the whole conversation.",
    Lifecycle.FINALIZE_CONNECTION: "exactly once per request, on every path; error is set when the run failed.",
    Lifecycle.ON_COMPACTION: "after each compaction that changed the conversation; `compaction` is the outcome, `between_turns` says whether a request is running.",
}

# Fields a hook may assign at each lifecycle point; everything else is read-only there.
WRITABLE: dict[Lifecycle, frozenset[str]] = {
    Lifecycle.ON_CONNECTION: frozenset({"messages", "stream"}),
    Lifecycle.BEFORE_LLM_CALL: frozenset({"messages", "tools", "model_settings"}),
    Lifecycle.AFTER_LLM_CALL: frozenset({"response", "usage"}),
    Lifecycle.ON_CHUNK: frozenset({"chunk", "content", "held"}),
    Lifecycle.BEFORE_TOOLCALL: frozenset({"tool_call", "tool_skipped", "tool_result"}),
    Lifecycle.AFTER_TOOLCALL: frozenset({"tool_result"}),
    Lifecycle.ON_MESSAGE: frozenset({"messages"}),
    Lifecycle.FINALIZE_CONNECTION: frozenset(),
    Lifecycle.ON_COMPACTION: frozenset(),
}

NOTIFICATIONS = frozenset({Lifecycle.FINALIZE_CONNECTION, Lifecycle.ON_COMPACTION})
"""Points that tell hooks of what happened rather than let them steer it: every hook runs,
a `HookError` is logged, and no failure aborts or blocks anything."""


def check_lifecycle(name: str) -> Lifecycle:
    """`name` as a Lifecycle, else a ValueError that lists the valid names."""
    try:
        return Lifecycle(name)
    except ValueError:
        raise ValueError(
            f"unknown lifecycle {name!r}; valid lifecycles are: {', '.join(LIFECYCLES)}"
        ) from None
