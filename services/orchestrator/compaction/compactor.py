"""An agent's compaction: its policy, the summary call, the in-run safety stop, the retry
after a "context too long" refusal, and telling the skills that listen.

The rules of compacting live in hookbus.services.orchestrator.compaction.rules (pure functions of
messages and a policy); this module binds them to one agent's model, LLM and skills. The
summary is one plain LLM call (`policy.model` or the agent's model): no hooks, not streamed,
not a tool round, and its usage is not added to the request's. Each compaction that
changed something is announced through `announce`: the agent runs its `on_compaction` stage
(hooks in-process and in worker groups alike); `ctx` is None between turns.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import structlog

from hookbus.bus.settings import get_settings
from hookbus.services.observability import tracing
from hookbus.services.orchestrator.compaction import rules
from hookbus.services.orchestrator.compaction.rules import Compaction, CompactionPolicy, Summarizer
from hookbus.services.orchestrator.compaction.token_scale import UNKNOWN_MODEL_MARGIN
from hookbus.services.orchestrator.compaction.tokens import context_window, count_messages
from hookbus.services.orchestrator.llm.client import LLM
from hookbus.skills import Context, ContextTooLong
from hookbus.skills.compaction_outcome import between_turns_id

log = structlog.get_logger("hookbus.agent")

PROBE_WINDOW_FLOOR = 2048
"""The window an unconfigured model is assumed to have at most when deciding whether to ask
the endpoint: llama-cpp-python's server starts with `n_ctx` 2048 unless told otherwise."""

_REFUSAL_NUMBERS = re.compile(
    r"maximum context length is (\d+) tokens.*?(?:resulted in|requested) (\d+) tokens",
    re.IGNORECASE | re.DOTALL,
)
Announce = Callable[[Compaction, Context | None], Awaitable[None]]
"""Tells the hooks of a compaction that changed something (ctx None: between turns); never raises."""

_REFUSAL_SHRINK = 0.9
"""Assumed ratio of the endpoint's window to our count when its refusal names no numbers."""


class Compactor:
    """Compaction for one agent (model, LLM and skills fixed when the agent is built).

    `last` is the last outcome that changed something, across every request and every
    call between turns; it is set in one place (`_announce`) and is a record for the host,
    never read by a run.
    """

    def __init__(
        self, llm: LLM, model: str, announce: Announce, policy: CompactionPolicy | None
    ) -> None:
        self._llm = llm
        self._model = model
        self._tell_hooks = announce
        self.configured_window = get_settings().context_window
        self.endpoint_window: int | None = None
        self.policy = policy or CompactionPolicy()
        self.last: Compaction | None = None

    @property
    def policy(self) -> CompactionPolicy:
        return self._policy

    @policy.setter
    def policy(self, policy: CompactionPolicy) -> None:
        if not isinstance(policy, CompactionPolicy):
            raise TypeError(
                f"compaction_policy must be a CompactionPolicy, not {type(policy).__name__}"
            )
        policy.resolve(self._model_window())  # refuse one that cannot work for this model
        self._policy = policy

    @property
    def window(self) -> int:
        """The model's context window in its own tokens, the first that is known of: the
        policy's `window`, `HOOKBUS_CONTEXT_WINDOW` (or the `--context-window` flag), what the
        endpoint says it serves (llama.cpp, vLLM; asked once, see `learn_model`), the
        built-in table, and for an unknown model a cautious 8192."""
        return self._policy.window or self._model_window()

    @property
    def budget(self) -> int:
        """The window as hookbus counts (tiktoken), what compaction works against: divided by
        the model's token scale (hookbus.services.orchestrator.compaction.token_scale), so that what
        fits by hookbus's count fits by the model's."""
        return max(1, int(self.window / self._llm.token_scale.of(self._model)))

    def _model_window(self) -> int:
        return (
            self.configured_window
            or self.endpoint_window
            or context_window(self._model, self._llm.context_windows())
        )

    def within_reach(self, counted: int) -> bool:
        """Whether a conversation of `counted` tokens (ours) could reach the compaction
        threshold once the endpoint is asked: counted by the most the model's tokenizer is
        assumed to count (UNKNOWN_MODEL_MARGIN until the model's scale is known), against
        the configured window or, unconfigured, at most PROBE_WINDOW_FLOOR (a local server
        may serve a model with a window far under the table's). Below it the endpoint is
        not asked: its answers could not change what compaction does."""
        scale = self._llm.token_scale
        margin = scale.of(self._model) if scale.knows(self._model) else max(
            scale.of(self._model), UNKNOWN_MODEL_MARGIN
        )
        window = self._policy.window or self.configured_window or min(
            PROBE_WINDOW_FLOOR, self._model_window()
        )
        return counted * margin >= self._policy.resolve(window).at

    async def learn_model(self, counted: int | None = None) -> None:
        """Ask the endpoint for the model's window and tokenizer scale when a conversation of
        `counted` tokens is within reach of the window (None: compaction was asked for, so
        always); at most once per model and endpoint in a process (`LLM.learn_model`)."""
        if counted is not None and not self.within_reach(counted):
            return
        window = await self._llm.learn_model(self._model, window=not self.configured_window)
        if window and window != self.endpoint_window:
            self.endpoint_window = window
            log.info("context_window_from_endpoint", model=self._model, window=window)

    async def between_turns(
        self, messages: Sequence[Mapping[str, Any]], tokens_of_next_message: int
    ) -> Compaction:
        await self.learn_model(count_messages(messages) + tokens_of_next_message)
        policy = self._policy
        with tracing.compaction_span("between_turns") as span:
            outcome = await rules.compact_if_needed(
                _plain(messages), tokens_of_next_message, policy, self.budget, self._summarizer(policy)
            )
            span.outcome(outcome)
            await self._announce(outcome, None)
        return outcome

    async def now(
        self, messages: Sequence[Mapping[str, Any]], focus: str | None
    ) -> Compaction:
        await self.learn_model()
        policy = self._policy
        with tracing.compaction_span("requested") as span:
            outcome = await rules.compact(
                _plain(messages), policy, self.budget, self._summarizer(policy), focus=focus
            )
            span.outcome(outcome)
            await self._announce(outcome, None)
        return outcome

    async def past_hard(self, messages: Sequence[Mapping[str, Any]]) -> bool:
        """Whether messages about to go to the LLM pass the in-run safety stop (the endpoint
        asked first when they are within reach of the window)."""
        counted = count_messages(messages)
        await self.learn_model(counted)
        return counted > self._policy.resolve(self.budget).hard

    async def in_run(
        self,
        messages: list[dict[str, Any]],
        ctx: Context,
        policy: CompactionPolicy | None = None,
        window: int | None = None,
    ) -> Compaction | None:
        """Compact the messages about to go to the LLM, keeping the turn in progress whole;
        None when nothing changed."""
        policy = policy or self._policy
        with tracing.compaction_span("in_run") as span:
            outcome = await rules.compact_in_run(
                messages, policy, window or self.budget, self._summarizer(policy), _turn_start(messages)
            )
            span.outcome(outcome)
            if outcome.stage == "none":
                return None
            await self._announce(outcome, ctx)
        return outcome

    async def after_refusal(
        self, messages: list[dict[str, Any]], refusal: ContextTooLong, ctx: Context
    ) -> Compaction | None:
        """The endpoint said the prompt is too long although our count said it fits: compact
        against the window the refusal implies (scaled to our count), once."""
        policy = self._policy
        ours = count_messages(messages)
        numbers = _REFUSAL_NUMBERS.search(refusal.message or "")
        ratio = _REFUSAL_SHRINK
        if numbers and int(numbers[2]) > int(numbers[1]) > 0:
            ratio = int(numbers[1]) / int(numbers[2])
        try:
            resolved = policy.resolve(self.budget)
            window = max(1, min(resolved.window, int(ours * ratio)))
            tighter = CompactionPolicy(
                auto=policy.auto,
                at=resolved.at / resolved.window,
                keep=resolved.keep / resolved.window,
                hard=resolved.hard / resolved.window,
                clear_tool_results=policy.clear_tool_results,
                model=policy.model,
                instructions=policy.instructions,
                window=window,
            )
        except ValueError:
            return None
        log.info(
            "context_too_long_compacting", completion_id=ctx.completion_id,
            counted=ours, window=window,
        )
        return await self.in_run(messages, ctx, tighter, window)

    def _summarizer(self, policy: CompactionPolicy) -> Summarizer:
        model = policy.model or self._model

        async def summarize(request: list[dict[str, Any]]) -> str:
            # A plain call: no hooks, not streamed, not a tool round, usage not counted.
            response = await self._llm.complete(model, request, None)
            return (response.choices[0].message.content or "") if response.choices else ""

        return summarize

    async def _announce(self, outcome: Compaction, ctx: Context | None) -> None:
        """Record a compaction that changed something and tell the hooks."""
        if outcome.stage == "none":
            return
        self.last = outcome
        log.info(
            "compacted", completion_id=ctx.completion_id if ctx is not None else between_turns_id(outcome.id),
            stage=outcome.stage, before=outcome.before, after=outcome.after, window=outcome.window,
            reason=outcome.reason,
        )
        await self._tell_hooks(outcome, ctx)


def _turn_start(messages: Sequence[Mapping[str, Any]]) -> int:
    """Index of the turn in progress: its (last) user message; 0 when there is none."""
    return next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "user"), 0
    )


def _plain(messages: Sequence[Any]) -> list[Mapping[str, Any]]:
    """Messages as mappings (pydantic message objects are dumped); the originals stay as they are."""
    return [m if isinstance(m, Mapping) else m.model_dump(exclude_none=True) for m in messages]
