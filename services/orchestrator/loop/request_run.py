"""One request's run: its state built (`begin`), then the lifecycle walk, top to bottom.

    on_connection
    per round:  before_llm_call -> LLM call (on_chunk per chunk) -> after_llm_call
                per tool call:  before_toolcall -> tool -> after_toolcall
    on_message
    finalize_connection          (exactly once, on every path)

Streaming and non-streaming share the one walk (`lifecycle`, a generator of the chunks
the client sees); the error that ends a run is recorded in its state for finalize.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any

import structlog
from openai.types.chat import ChatCompletionChunk

from hookbus.services.orchestrator.loop import client_tools
from hookbus.services.orchestrator.loop.final_completion import (
    final_completion,
    finish_reason,
    usage_chunk,
)
from hookbus.services.orchestrator.loop.finalize import finalize_shielded, stop_error
from hookbus.services.orchestrator.loop.host import LoopHost
from hookbus.services.orchestrator.loop.instructions import with_instructions
from hookbus.services.orchestrator.loop.llm_round import after_llm_call, before_llm_call, llm_call
from hookbus.services.orchestrator.loop.observer_handoff import RequestObservations
from hookbus.services.orchestrator.loop.request_state import RequestState
from hookbus.services.orchestrator.loop.run_steps import RUN_STEPS, RunSteps, changes
from hookbus.services.orchestrator.loop.stage_runner import hookless, in_process, stage
from hookbus.services.orchestrator.loop.tool_round import tool_round
from hookbus.services.orchestrator.streaming.turn_stream import TurnStream
from hookbus.services.process.offload import is_large, off_loop
from hookbus.skills import AuthInfo, Context, HookbusError, HookData, ServiceError
from hookbus.skills.context import Metadata, Session
from hookbus.skills.errors import Cancelled, DeadlineExceeded, as_hookbus_error
from hookbus.skills.lifecycle import Lifecycle
from hookbus.skills.model_settings import ModelSettings, as_model_settings

log = structlog.get_logger("hookbus.agent")

DEADLINE_SLACK = 0.05
"""A cancellation this close to the deadline is the deadline's (timers fire a little early)."""


async def begin(
    host: LoopHost,
    messages: Sequence[dict[str, Any]] | str,
    auth: AuthInfo | dict[str, Any] | None,
    session_id: str | None,
    completion_id: str | None,
    metadata: dict[str, Any] | None,
    stream: bool,
    model: str | None = None,
) -> RequestState:
    """The request's state; `model`, one of the agent's `models` its LLM calls use (in
    `ctx.metadata.model`, which the loop calls the model by)."""
    if model is not None and model != host.model and model not in host.models:
        raise ServiceError(
            404, "model_not_found", f"agent {host.name!r} does not offer the model {model!r}"
        )
    ctx = Context(
        auth=auth if isinstance(auth, AuthInfo) else AuthInfo.model_validate(auth or {}),
        metadata=Metadata(
            completion_id=completion_id or f"chatcmpl-{uuid.uuid4().hex}",
            model=model or host.model,
            agent_name=host.name,
            **(metadata or {}),
        ),
        session=Session(id=session_id),
    )
    conversation = await off_loop(is_large(messages), _conversation, host.instructions, messages)  # a deep copy
    state = RequestState(ctx, host.plan(), conversation, stream, steps=RUN_STEPS.get() or RunSteps())
    ctx.recovery = state.steps.resumed
    if state.plan.observes(ctx.auth.scopes):
        state.observations = RequestObservations(ctx, host.local_observers, host.runtime)
    return state


def request_options(
    host: LoopHost,
    state: RequestState,
    tools: Sequence[dict[str, Any]] | None,
    model_settings: ModelSettings | dict[str, Any] | None,
    deadline: float | None,
    on_progress: Callable[[str], None] | None,
) -> None:
    state.client_tools = [copy.deepcopy(dict(t)) for t in tools or ()]
    state.settings = host.model_settings.merged(as_model_settings(model_settings), host.pinned_settings)
    state.deadline = deadline
    state.on_progress = on_progress


async def streamed(
    host: LoopHost, begun: Callable[[], Awaitable[RequestState]], options: tuple[Any, ...]
) -> AsyncGenerator[ChatCompletionChunk, None]:
    """The request `begun` starts, streamed; begun only when the caller first reads."""
    state = await begun()
    request_options(host, state, *options)
    async with contextlib.aclosing(lifecycle(host, state)) as chunks:
        async for chunk in chunks:
            yield chunk


async def lifecycle(host: LoopHost, state: RequestState) -> AsyncGenerator[ChatCompletionChunk, None]:
    """The whole request; a generator so streaming and non-streaming share one path."""
    try:
        if state.ctx.session.id:
            state.ctx.session.data = await host.runtime.load_session(
                state.ctx.auth.peer_user_id, state.ctx.session.id
            )
        state.conversation = await client_tools.restore_held_results(
            host.runtime, state.ctx.auth.peer_user_id, state.conversation
        )
        await _on_connection(host, state)
        turn = TurnStream(state.completion_id, state.ctx.metadata.model) if state.stream else None
        if turn is not None:
            turn.role_sent = state.steps.role_sent  # a resumed stream's client has it
        rounds = 0
        while True:
            final_round = rounds >= host.max_tool_rounds
            messages, tools, settings = await before_llm_call(host, state, rounds, final_round)
            async with contextlib.aclosing(llm_call(host, state, messages, tools, settings, final_round, rounds)) as chunks:
                async for chunk in chunks:
                    shown = turn.visible(chunk) if turn is not None else chunk
                    if shown is not None:
                        yield shown
            message = await after_llm_call(host, state, rounds)
            if final_round or not message.get("tool_calls"):
                break
            state.client_calls = await tool_round(host, state, message, rounds)
            if state.client_calls:
                break
            rounds += 1
        await _on_message(host, state)
        if turn is not None:
            for chunk in turn.finish(finish_reason(state), state.client_calls):
                yield chunk
            yield usage_chunk(state, state.ctx.metadata.model)
    except HookbusError as exc:
        state.error = exc
        raise
    except asyncio.CancelledError:
        if state.deadline is not None and time.time() >= state.deadline - DEADLINE_SLACK:
            state.error = DeadlineExceeded()
        else:
            state.error = stop_error(host, state) or Cancelled()
        raise
    except GeneratorExit:
        state.error = Cancelled("the client stopped reading", code="client_closed")
        raise
    except Exception as exc:
        state.error = as_hookbus_error(exc)
        log.exception("run_failed", completion_id=state.completion_id)
        raise state.error from exc
    finally:
        await finalize_shielded(host, state)


async def _on_connection(host: LoopHost, state: RequestState) -> None:
    data = HookData.model_construct(
        lifecycle=Lifecycle.ON_CONNECTION, messages=state.conversation, stream=state.stream
    )
    await _conversation_stage(host, state, data)


async def _on_message(host: LoopHost, state: RequestState) -> None:
    data = HookData.model_construct(lifecycle=Lifecycle.ON_MESSAGE, messages=state.conversation)
    await _conversation_stage(host, state, data)
    state.result = final_completion(state, state.ctx.metadata.model)


async def _conversation_stage(host: LoopHost, state: RequestState, data: HookData) -> None:
    """A stage whose hooks may change the conversation (on_connection, on_message): run,
    its change put on record; or, when a predecessor ran it, that change replayed."""
    key = data.lifecycle
    done = state.steps.replay(key, state.ctx)
    replayed = None if done is None else state.steps.messages(key, state.conversation, done["messages"])
    if replayed is not None:
        state.conversation = replayed
        return
    before = state.steps.start(state.conversation, in_process(state, key))
    data = await stage(host, state, data)
    state.conversation = list(data.messages or [])
    await state.steps.done(key, {"messages": changes(before, state.conversation)}, state.ctx, free=hookless(state, key))


def _conversation(instructions: str | None, messages: Sequence[dict[str, Any]] | str) -> list[dict[str, Any]]:
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    conversation = [
        copy.deepcopy(m if isinstance(m, dict) else m.model_dump(exclude_none=True))
        for m in messages
    ]
    if instructions:
        return with_instructions(instructions, conversation)
    return conversation
