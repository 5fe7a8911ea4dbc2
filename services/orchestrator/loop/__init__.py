"""The agent loop: one request, top to bottom, in lifecycle order.

    on_connection
    per round:  before_llm_call -> LLM call (on_chunk per chunk) -> after_llm_call
                per tool call:  before_toolcall -> tool -> after_toolcall
    on_message
    finalize_connection          (exactly once, on every path)

Each lifecycle point is fired in one place. Where a hook runs (this process or a worker
group) is the runtime's business, never the loop's.

`agent` holds `Agent`, the public face: what a caller asks of it. The walk is
`request_run`'s (a request's `RequestState`, `request_state`, built by `begin`, then
`lifecycle`); its stages are `llm_round` (before_llm_call, the call, after_llm_call),
`chunk_stage` (on_chunk), `tool_round` (before_toolcall, the tool, after_toolcall) and
`finalize`; `stage_runner` runs any one stage's hooks, `final_completion` builds what
the client gets, and `host` says what of the agent the stages read. Beside them: `plan`
(the merged hook order and tool catalogue), `runtime` (where remote hooks, tools and
sessions live), `client_tools`, `instructions` and `observer_handoff` (a request's
observed stages handed to its observers, off the request's path).

Compaction keeps a conversation inside the model's context window (the agent's
`Compactor`, hookbus.services.orchestrator.compaction.compactor). Between turns the host
calls `compact_if_needed` / `compact`; inside a run, after `before_llm_call`, messages past
the policy's `hard` threshold are compacted (the turn in progress stays whole) and the
compacted conversation replaces the run's own, so later rounds do not grow back. An
endpoint that still answers "context too long" gets one compaction and one retry.
Streamed chunks go through on_chunk in hookbus.services.orchestrator.streaming.chunk_pipeline.

Exposes `Agent`.
"""

from hookbus.services.orchestrator.loop.agent import Agent

__all__ = ["Agent"]
