"""One LLM round of the loop: before_llm_call, the call (streamed or not), after_llm_call.

Inside a run, after `before_llm_call`, messages past the compaction policy's `hard`
threshold are compacted (the turn in progress stays whole) and the compacted conversation
replaces the run's own, so later rounds do not grow back. An endpoint that still answers
"context too long" gets one compaction and one retry. The last round allowed
(`max_tool_rounds`) is told so and offered no tools.

Each of the three steps is put on record as it ends (hookbus.services.orchestrator.loop.
run_steps); in a run that took the request over from a dead orchestrator, a step its
predecessor completed is replayed from the record instead: its hooks do not run again
and a finished LLM call is not made again.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import structlog
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from hookbus.bus.wire.envelopes import LLM_RETRY
from hookbus.services.orchestrator.llm.answers import EmptyAnswer
from hookbus.services.orchestrator.loop import client_tools
from hookbus.services.orchestrator.loop.chunk_stage import guarded_answer, streamed_llm_call
from hookbus.services.orchestrator.loop.host import LoopHost
from hookbus.services.orchestrator.loop.request_state import RequestState
from hookbus.services.orchestrator.loop.run_steps import changes
from hookbus.services.orchestrator.loop.stage_runner import hookless, in_process, stage
from hookbus.services.orchestrator.streaming.assemble import add_usage
from hookbus.skills import HookData
from hookbus.skills.compaction_outcome import Compaction
from hookbus.skills.errors import ContextTooLong
from hookbus.skills.lifecycle import Lifecycle
from hookbus.skills.model_settings import ModelSettings

log = structlog.get_logger("hookbus.agent")

ROUND_CAP_NOTE = (
    "You have used every tool round allowed for this request. Do not call tools; "
    "answer now with what you have."
)


async def before_llm_call(
    host: LoopHost, state: RequestState, iteration: int, final_round: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, ModelSettings]:
    messages = [dict(m) for m in state.conversation]  # the LLM's copy; the conversation stays
    if final_round:
        messages.append(_round_cap_message())
    tools = None
    if not final_round:
        own = state.plan.tool_schemas(state.ctx.auth.scopes)
        tools = client_tools.offered_tools(own, state.client_tools) or None
    key, conversation = f"before_llm_call#{iteration}", state.conversation
    if (done := state.steps.replay(key, state.ctx)) is not None:
        replayed = _replayed_llm_input(state, key, done, messages, tools)
        if replayed is not None:
            return replayed
    settings = state.settings.model_copy(deep=True)
    if iteration > 0 and settings.forces_tool:
        settings.tool_choice = "auto"  # forcing every round would loop to the round cap
    base = state.steps.start(messages, in_process(state, Lifecycle.BEFORE_LLM_CALL))
    data = HookData.model_construct(
        lifecycle=Lifecycle.BEFORE_LLM_CALL, messages=messages, tools=tools, iteration=iteration,
        model_settings=settings,
    )
    data = await stage(host, state, data, key)
    settings = data.model_settings or ModelSettings()
    messages = list(data.messages or [])
    if await host.compactor.past_hard(messages):  # the in-run safety stop
        outcome = await host.compactor.in_run(messages, state.ctx)
        if outcome is not None:
            messages = _adopt(state, outcome, final_round)
    record: dict[str, Any] = {
        "messages": changes(base, messages), "settings": settings.model_dump(mode="json", exclude_none=True),
    }
    if data.tools != tools:
        record["tools"] = data.tools
    compacted = state.conversation is not conversation
    if compacted:
        record["conversation"] = changes(conversation, state.conversation)
    free = not compacted and hookless(state, Lifecycle.BEFORE_LLM_CALL)
    await state.steps.done(key, record, state.ctx, free=free)
    return messages, data.tools or None, settings


def _replayed_llm_input(
    state: RequestState, key: str, done: dict[str, Any], messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, ModelSettings] | None:
    """What a recorded before_llm_call (and the compaction after it) gave the LLM call;
    None when the record does not fit this run (the rest of it runs)."""
    replayed = state.steps.messages(key, messages, done["messages"])
    if replayed is None:
        return None
    if "conversation" in done:
        compacted = state.steps.messages(key, state.conversation, done["conversation"])
        if compacted is None:
            return None
        state.conversation = compacted
    return replayed, done.get("tools", tools) or None, ModelSettings.model_validate(done["settings"])


async def llm_call(
    host: LoopHost,
    state: RequestState,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    settings: ModelSettings,
    final_round: bool,
    iteration: int,
) -> AsyncGenerator[ChatCompletionChunk, None]:
    """One LLM call (streamed or not); a "context too long" refusal that comes before any
    chunk gets one compaction and one retry, else the error stands. An empty answer under
    `tool_choice: "auto"` (nothing of it reached the client: the adapter held its chunks)
    is asked once more with "none", as `_asked_again` says. A call a predecessor finished
    is not made again: its answer is replayed (a resumed stream's client got none of its
    text: hookbus.services.orchestrator.serving.execution, `resumption`)."""
    key, conversation = f"llm_call#{iteration}", state.conversation
    if (done := state.steps.replay(key, state.ctx)) is not None and _replayed_answer(state, key, done):
        return
    await state.steps.calling()
    retried = False
    while True:
        chunks_before = state.chunks_seen
        try:
            with _recorded_llm_call(host, state):
                if state.stream:
                    async with contextlib.aclosing(
                        streamed_llm_call(host, state, messages, tools, settings)
                    ) as chunks:
                        async for chunk in chunks:
                            yield chunk
                else:
                    answer = await host.llm.complete(state.ctx.metadata.model, messages, tools, settings)
                    answer.id = state.completion_id
                    state.last_response = answer
                    if state.plan.hold_back(state.ctx.auth.scopes):
                        state.last_response = await guarded_answer(host, state, answer)
            await state.steps.done(key, _answer_record(state, conversation), state.ctx)
            return
        except ContextTooLong as refusal:
            if retried or state.chunks_seen != chunks_before:
                raise
            retried = True
            outcome = await host.compactor.after_refusal(messages, refusal, state.ctx)
            if outcome is None:
                raise
            messages = _adopt(state, outcome, final_round)
        except EmptyAnswer as empty:
            if not empty.under_auto:
                raise
            settings = _asked_again(state, empty, settings)


def _answer_record(state: RequestState, conversation: list[dict[str, Any]]) -> dict[str, Any]:
    """What an LLM call gave the run: its answer, the usage so far (an answer asked again
    counts), the conversation if a refusal made it compact."""
    assert state.last_response is not None
    record: dict[str, Any] = {
        "response": state.last_response.model_dump(mode="json"),
        "usage": state.usage.model_dump(mode="json") if state.usage else None,
    }
    if state.conversation is not conversation:
        record["conversation"] = changes(conversation, state.conversation)
    return record


def _replayed_answer(state: RequestState, key: str, done: dict[str, Any]) -> bool:
    """Take a recorded LLM call's answer; False when the record does not fit this run."""
    if "conversation" in done:
        compacted = state.steps.messages(key, state.conversation, done["conversation"])
        if compacted is None:
            return False
        state.conversation = compacted
    state.last_response = ChatCompletion.model_validate(done["response"])
    state.usage = CompletionUsage.model_validate(done["usage"]) if done.get("usage") else None
    return True


@contextlib.contextmanager
def _recorded_llm_call(host: LoopHost, state: RequestState) -> Iterator[None]:
    """Time one LLM call into the events stream (its error, if it raised); one that is
    asked again is recorded as LLM_RETRY, its reason first, for the waterfall and the
    gateway's `hookbus_llm_retries`."""
    started, lifecycle, error = time.perf_counter(), "llm_call", None
    try:
        yield
    except Exception as exc:
        error = str(exc) or type(exc).__name__
        if isinstance(exc, EmptyAnswer) and exc.under_auto:
            lifecycle, error = LLM_RETRY, f"empty_answer: {exc}; asked again with tool_choice none"
        raise
    finally:
        host.runtime.record_call(
            state.completion_id, lifecycle, state.ctx.metadata.model, (time.perf_counter() - started) * 1000, error
        )


async def after_llm_call(host: LoopHost, state: RequestState, iteration: int) -> dict[str, Any]:
    response = state.last_response
    assert response is not None
    state.usage = add_usage(state.usage, response.usage)
    key = f"after_llm_call#{iteration}"
    if (done := state.steps.replay(key, state.ctx)) is not None:
        changed = done.get("response")
        state.last_response = response if changed is None else ChatCompletion.model_validate(changed)
    else:
        data = HookData.model_construct(
            lifecycle=Lifecycle.AFTER_LLM_CALL, response=response, usage=response.usage, iteration=iteration
        )
        before = response.model_dump(mode="json") if state.steps.recording else None
        data = await stage(host, state, data, key)
        state.last_response = data.response or response
        after = state.last_response.model_dump(mode="json") if state.steps.recording else None
        await state.steps.done(key, {"response": None if after == before else after}, state.ctx)
    message = client_tools.conversation_message(state.last_response.choices[0].message)
    state.conversation.append(message)
    return message


def _asked_again(state: RequestState, empty: EmptyAnswer, settings: ModelSettings) -> ModelSettings:
    """The settings to ask an empty answer under `tool_choice: "auto"` again with: "none".
    An endpoint may answer a text under "auto" with an empty message (llama-cpp-python's
    `chatml-function-calling` does: its grammar offers the model a tool name or the end of
    its turn); under "none" the model answers in text. What the empty answer cost counts in
    the request's usage."""
    log.warning(
        "llm_asked_again", completion_id=state.completion_id, reason="empty_answer",
        finish_reason=empty.finish_reason, tool_choice="none",
    )
    state.usage = add_usage(state.usage, empty.usage)
    return settings.model_copy(update={"tool_choice": "none"})


def _round_cap_message() -> dict[str, Any]:
    return {"role": "system", "content": ROUND_CAP_NOTE}


def _adopt(state: RequestState, outcome: Compaction, final_round: bool) -> list[dict[str, Any]]:
    """An in-run compaction becomes the run's conversation (without the round-cap note), so
    later rounds do not grow back; returns the messages to send now."""
    conversation = copy.deepcopy(outcome.messages)
    if final_round and conversation and conversation[-1] == _round_cap_message():
        conversation.pop()
    state.conversation = conversation
    return copy.deepcopy(outcome.messages)
