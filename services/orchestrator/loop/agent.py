"""The agent loop: one request, top to bottom, in lifecycle order.

    on_connection
    per round:  before_llm_call -> LLM call (on_chunk per chunk) -> after_llm_call
                per tool call:  before_toolcall -> tool -> after_toolcall
    on_message
    finalize_connection          (exactly once, on every path)

Each lifecycle point is fired in one place below. Where a hook runs (this process or a
worker group) is the runtime's business, never the loop's.

Compaction keeps a conversation inside the model's context window (the agent's
`Compactor`, hookbus.services.orchestrator.compaction.compactor). Between turns the host calls
`compact_if_needed` / `compact`; inside a run, after `before_llm_call`, messages past the
policy's `hard` threshold are compacted (the turn in progress stays whole) and the
compacted conversation replaces the run's own, so later rounds do not grow back. An
endpoint that still answers "context too long" gets one compaction and one retry.
Streamed chunks go through on_chunk in hookbus.services.orchestrator.streaming.chunk_pipeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import functools
import time
import uuid
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextvars import ContextVar
from itertools import groupby
from typing import Any

import structlog
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from hookbus.bus.settings import OFFLINE_MODEL, get_settings
from hookbus.bus.wire.chunk_batch import ChunkIn
from hookbus.bus.wire.envelopes import LLM_RETRY
from hookbus.services.observability import tracing
from hookbus.services.orchestrator.compaction.compactor import Compactor
from hookbus.services.orchestrator.compaction.rules import Compaction, CompactionPolicy
from hookbus.services.orchestrator.llm.answers import EmptyAnswer
from hookbus.services.orchestrator.llm.client import LLM
from hookbus.services.orchestrator.loop import client_tools
from hookbus.services.orchestrator.loop.instructions import with_instructions
from hookbus.services.orchestrator.loop.observer_handoff import LocalObservers, RequestObservations
from hookbus.services.orchestrator.loop.plan import HookPlan, Segment
from hookbus.services.orchestrator.loop.request_state import RequestState
from hookbus.services.orchestrator.loop.runtime import LocalRuntime, Runtime
from hookbus.services.orchestrator.streaming.assemble import add_usage
from hookbus.services.orchestrator.streaming.chunk_pipeline import Judged, stream_chunks
from hookbus.services.orchestrator.streaming.hold_back import whole_answer_chunk
from hookbus.services.orchestrator.streaming.turn_stream import TurnStream
from hookbus.services.process.offload import is_large, off_loop
from hookbus.skills import AuthInfo, Context, HookbusError, HookData, Skill
from hookbus.skills.compaction_outcome import between_turns_id
from hookbus.skills.context import Metadata, Session
from hookbus.skills.errors import Cancelled, ContextTooLong, DeadlineExceeded, as_hookbus_error
from hookbus.skills.lifecycle import NOTIFICATIONS, Lifecycle
from hookbus.skills.model_settings import ModelSettings, as_model_settings
from hookbus.skills.runner import ChainResult, run_hooks, stage_goes_on
from hookbus.skills.toolcall import ToolProblem, invoke_tool, parse_arguments

log = structlog.get_logger("hookbus.agent")

_SERVED_BY: ContextVar[tuple[Agent, Runtime] | None] = ContextVar("hookbus_served_by", default=None)
"""The agent and the runtime of the orchestrator service running the current request
(`Agent.serving_on`)."""

ROUND_CAP_NOTE = (
    "You have used every tool round allowed for this request. Do not call tools; "
    "answer now with what you have."
)
DEADLINE_SLACK = 0.05
"""A cancellation this close to the deadline is the deadline's (timers fire a little early)."""
DEFAULT_CHUNK_BATCH = 64
"""Chunks one on_chunk hop carries at most: big enough that a fast model's stream costs a
few hops, small enough that one hop's entry stays a few tens of kB."""


class Agent:
    """An agent: a model, instructions, skills; `run` or `run_stream` one request at a time or many.

    An agent holds no per-request state, so one instance serves concurrent requests and
    may be used from several event loops one after another. The one record it keeps is
    `last_compaction` (docs/guide.md): the last compaction outcome that changed something.

    `model_settings` are the agent's defaults for every LLM call (a client's values replace
    them), `pinned_settings` the values a client cannot change (they replace the client's);
    see hookbus.skills.model_settings for which call each field applies to.

    `chunk_batch`: at most how many streamed chunks one on_chunk hop carries when the
    stage's hooks all live in one worker group (hookbus.services.orchestrator.
    chunk_pipeline: each hop takes the chunks that arrived while the previous one was in
    flight; hooks see exactly what one hop per chunk would show them). 1 sends one hop
    per chunk.

    With no endpoint (`llm`, else `OPENAI_BASE_URL`) an agent used in-process answers with
    the built-in offline model, for tests and first steps; the orchestrator service refuses
    to run an agent so (hookbus.services.orchestrator.llm.client.require_endpoint) unless
    `HOOKBUS_MODEL=offline` asks for it by name.
    """

    def __init__(
        self,
        name: str,
        model: str | None = None,
        instructions: str | None = None,
        skills: Iterable[Skill | type[Skill]] = (),
        llm: LLM | None = None,
        max_tool_rounds: int = 50,
        runtime: Runtime | None = None,
        compaction_policy: CompactionPolicy | None = None,
        chunk_batch: int = DEFAULT_CHUNK_BATCH,
        model_settings: ModelSettings | dict[str, Any] | None = None,
        pinned_settings: ModelSettings | dict[str, Any] | None = None,
    ) -> None:
        if max_tool_rounds < 0:
            raise ValueError("max_tool_rounds must be >= 0")
        if chunk_batch < 1:
            raise ValueError("chunk_batch must be >= 1")
        self.name = name
        self.llm = llm or LLM()
        self.model = model or get_settings().model or OFFLINE_MODEL
        self.instructions = instructions
        self.model_settings = as_model_settings(model_settings) or ModelSettings()
        self.pinned_settings = as_model_settings(pinned_settings) or ModelSettings()
        self.skills: list[Skill] = [s() if isinstance(s, type) else s for s in skills]
        self._compactor = Compactor(self.llm, self.model, self._on_compaction, compaction_policy)
        self._chunk_batch = chunk_batch
        self.max_tool_rounds = max_tool_rounds
        self._runtime: Runtime = runtime or LocalRuntime()
        self._local_hooks = [h for skill in self.skills for h in skill.bound_hooks()]
        self._local_tools = [t for skill in self.skills for t in skill.bound_tools()]
        self._plan: HookPlan | None = None
        self._plan_version: tuple[int, int] = (0, -1)
        self.local_observers = LocalObservers()
        """Runs this agent's in-process observers (hookbus.services.orchestrator.loop.observer_handoff)."""

    # ----------------------------------------------------------------- public API

    async def run(
        self,
        messages: Sequence[dict[str, Any]] | str,
        auth: AuthInfo | dict[str, Any] | None = None,
        session_id: str | None = None,
        *,
        completion_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
        model_settings: ModelSettings | dict[str, Any] | None = None,
        deadline: float | None = None,
    ) -> ChatCompletion:
        """Run one request to its end; raises the error that ended it: the `HookError` a hook
        aborted it with, or the `ServiceError` of what failed around the hooks.

        `tools` are the caller's own (client) tools, offered to the model with the agent's
        (a client tool overrides an agent tool of the same name). When the model calls one,
        the run ends there: the completion's message carries those calls
        (`finish_reason="tool_calls"`), and the caller sends their results in its next
        request (`client_tools.run_outcome` reads a completion as text + client calls).
        `model_settings` are the caller's sampling and format fields. `deadline` (unix
        time) is when the caller stops waiting: a run cancelled at or after it finalizes
        with a 504, as the caller saw it."""
        state = await self._begin(messages, auth, session_id, completion_id, metadata, stream=False)
        self._request_options(state, tools, model_settings, deadline, None)
        async for _ in self._lifecycle(state):
            pass
        assert state.result is not None
        return state.result

    def run_stream(
        self,
        messages: Sequence[dict[str, Any]] | str,
        auth: AuthInfo | dict[str, Any] | None = None,
        session_id: str | None = None,
        *,
        completion_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
        model_settings: ModelSettings | dict[str, Any] | None = None,
        deadline: float | None = None,
        on_progress: Callable[[str], None] | None = None,
    ) -> AsyncIterator[ChatCompletionChunk]:
        """An async generator of the chunks the client sees, as the hooks made them.

        The whole request streams as one assistant turn (hookbus.services.orchestrator.
        turn_stream): one role delta, the text of every round, tool-call deltas only for
        the client's tools, then exactly one chunk with the finish_reason. The last chunk
        has no choices and carries the usage summed over every LLM call. Stopping early
        (`aclose()`) ends the request; finalize_connection still runs. `on_progress` is
        told, in one line, when a server-side tool starts and ends (the gateway shows
        these as SSE comments). The other options are `run`'s.
        """
        return self._stream(
            functools.partial(self._begin, messages, auth, session_id, completion_id, metadata, stream=True),
            (tools, model_settings, deadline, on_progress),
        )

    async def aclose(self) -> None:
        """Close the LLM client of the running loop (needed with `http="aiohttp"`: its
        session belongs to that loop); the agent can still run after, with a new one."""
        await self.llm.aclose()

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """`async with Agent(...) as agent:` closes the client on leaving (`aclose`)."""
        await self.aclose()

    async def finalize_only(
        self,
        messages: Sequence[dict[str, Any]] | str,
        *,
        completion_id: str,
        error: HookbusError,
        auth: AuthInfo | dict[str, Any] | None = None,
        session_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        recovery: bool = True,
    ) -> None:
        """Run only `finalize_connection` (with `data.error` = `error`) for a request whose
        run was lost, e.g. its orchestrator died; hooks see `ctx.recovery`. Never raises for
        a hook's failure; the session is loaded first and saved after, as in a run."""
        state = await self._begin(messages, auth, session_id, completion_id, metadata, stream=False)
        state.ctx.recovery = recovery
        state.error = error
        if state.ctx.session.id:
            try:
                state.ctx.session.data = await self.runtime.load_session(
                    state.ctx.auth.peer_user_id, state.ctx.session.id
                )
            except Exception:  # noqa: BLE001 - finalize runs even without the session
                log.exception("session_load_failed", completion_id=state.completion_id)
        await self._finalize_shielded(state)

    async def observers_idle(self, timeout: float | None = None) -> bool:
        """Wait until this agent's in-process observers have seen every stage handed to
        them (they run off the requests' path); False if `timeout` seconds passed first."""
        return await self.local_observers.wait(timeout)

    # ---------------------------------------------------------------- compaction

    @property
    def chunk_batch(self) -> int:
        """At most how many chunks one on_chunk hop carries (set when the agent is built)."""
        return self._chunk_batch

    @property
    def compaction_policy(self) -> CompactionPolicy:
        """The policy in force; replace it as a whole (it is frozen), e.g.
        `agent.compaction_policy = CompactionPolicy(at=0.7)`."""
        return self._compactor.policy

    @compaction_policy.setter
    def compaction_policy(self, policy: CompactionPolicy) -> None:
        self._compactor.policy = policy

    @property
    def last_compaction(self) -> Compaction | None:
        """The last compaction outcome that changed something (any request, or between turns)."""
        return self._compactor.last

    @property
    def context_window(self) -> int:
        """Tokens compaction budgets against: the policy's `window`, else the model's."""
        return self._compactor.window

    async def compact_if_needed(
        self, messages: Sequence[Mapping[str, Any]], tokens_of_next_message: int
    ) -> Compaction:
        """Between turns: compact when `messages` plus the next message would pass `at`.

        `messages` is never changed; keep `outcome.messages` when `outcome.stage != "none"`.
        """
        return await self._compactor.between_turns(messages, tokens_of_next_message)

    async def compact(
        self, messages: Sequence[Mapping[str, Any]], focus: str | None = None
    ) -> Compaction:
        """Compact now, whatever the size: everything before the latest exchange becomes one
        summary, steered by `focus`. `messages` is never changed."""
        return await self._compactor.now(messages, focus)

    @property
    def runtime(self) -> Runtime:
        """Where this agent's remote hooks, tools and sessions live: the runtime of the
        orchestrator service running the current request (`serving_on`), else the one it
        was given or last bound to."""
        serving = _SERVED_BY.get()
        if serving is not None and serving[0] is self:
            return serving[1]
        return self._runtime

    @runtime.setter
    def runtime(self, runtime: Runtime) -> None:
        self._runtime = runtime

    @contextlib.contextmanager
    def serving_on(self, runtime: Runtime) -> Iterator[None]:
        """Run what happens inside (one request, and the tasks it starts) on `runtime`.
        Orchestrator services of one process may share an agent; each request's hops must
        still go through the service that runs it: its version pins, its owner checks,
        its stage notes. Binding one shared attribute let the last service started take
        every other service's hops."""
        token = _SERVED_BY.set((self, runtime))
        try:
            yield
        finally:
            _SERVED_BY.reset(token)

    def plan(self) -> HookPlan:
        """The merged hook order; rebuilt only when the runtime or its remote set changed."""
        runtime = self.runtime
        version = (id(runtime), runtime.remote_version())
        if self._plan is None or version != self._plan_version:
            self._plan = HookPlan.build(
                self._local_hooks,
                self._local_tools,
                runtime.remote_hooks(),
                runtime.remote_tools(),
            )
            self._plan_version = version
        return self._plan

    # ------------------------------------------------------------------ lifecycle

    async def _stream(
        self, begin: Callable[[], Awaitable[RequestState]], options: tuple[Any, ...]
    ) -> AsyncGenerator[ChatCompletionChunk, None]:
        """The request `begin` starts, streamed; begun only when the caller first reads."""
        state = await begin()
        self._request_options(state, *options)
        async with contextlib.aclosing(self._lifecycle(state)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _begin(
        self,
        messages: Sequence[dict[str, Any]] | str,
        auth: AuthInfo | dict[str, Any] | None,
        session_id: str | None,
        completion_id: str | None,
        metadata: dict[str, Any] | None,
        stream: bool,
    ) -> RequestState:
        ctx = Context(
            auth=auth if isinstance(auth, AuthInfo) else AuthInfo.model_validate(auth or {}),
            metadata=Metadata(
                completion_id=completion_id or f"chatcmpl-{uuid.uuid4().hex}",
                model=self.model,
                agent_name=self.name,
                **(metadata or {}),
            ),
            session=Session(id=session_id),
        )
        conversation = await off_loop(is_large(messages), self._conversation, messages)  # a deep copy
        state = RequestState(ctx, self.plan(), conversation, stream)
        if state.plan.observes(ctx.auth.scopes):
            state.observations = RequestObservations(ctx, self.local_observers, self.runtime)
        return state

    def _request_options(
        self,
        state: RequestState,
        tools: Sequence[dict[str, Any]] | None,
        model_settings: ModelSettings | dict[str, Any] | None,
        deadline: float | None,
        on_progress: Callable[[str], None] | None,
    ) -> None:
        state.client_tools = [copy.deepcopy(dict(t)) for t in tools or ()]
        state.settings = self.model_settings.merged(as_model_settings(model_settings), self.pinned_settings)
        state.deadline = deadline
        state.on_progress = on_progress

    async def _lifecycle(self, state: RequestState) -> AsyncGenerator[ChatCompletionChunk, None]:
        """The whole request; a generator so streaming and non-streaming share one path."""
        try:
            if state.ctx.session.id:
                state.ctx.session.data = await self.runtime.load_session(
                    state.ctx.auth.peer_user_id, state.ctx.session.id
                )
            state.conversation = await client_tools.restore_held_results(
                self.runtime, state.ctx.auth.peer_user_id, state.conversation
            )
            await self._on_connection(state)
            turn = TurnStream(state.completion_id, self.model) if state.stream else None
            rounds = 0
            while True:
                final_round = rounds >= self.max_tool_rounds
                messages, tools, settings = await self._before_llm_call(state, rounds, final_round)
                async with contextlib.aclosing(
                    self._llm_call(state, messages, tools, settings, final_round)
                ) as chunks:
                    async for chunk in chunks:
                        shown = turn.visible(chunk) if turn is not None else chunk
                        if shown is not None:
                            yield shown
                message = await self._after_llm_call(state, rounds)
                if final_round or not message.get("tool_calls"):
                    break
                state.client_calls = await self._tool_round(state, message)
                if state.client_calls:
                    break
                rounds += 1
            await self._on_message(state)
            if turn is not None:
                for chunk in turn.finish(self._finish_reason(state), state.client_calls):
                    yield chunk
                yield self._usage_chunk(state)
        except HookbusError as exc:
            state.error = exc
            raise
        except asyncio.CancelledError:
            if state.deadline is not None and time.time() >= state.deadline - DEADLINE_SLACK:
                state.error = DeadlineExceeded()
            else:
                state.error = self._stop_error(state) or Cancelled()
            raise
        except GeneratorExit:
            state.error = Cancelled("the client stopped reading", code="client_closed")
            raise
        except Exception as exc:
            state.error = as_hookbus_error(exc)
            log.exception("run_failed", completion_id=state.completion_id)
            raise state.error from exc
        finally:
            await self._finalize_shielded(state)

    async def _on_connection(self, state: RequestState) -> None:
        data = HookData.model_construct(
            lifecycle=Lifecycle.ON_CONNECTION, messages=state.conversation, stream=state.stream
        )
        data = await self._stage(state, data)
        state.conversation = list(data.messages or [])

    async def _before_llm_call(
        self, state: RequestState, iteration: int, final_round: bool
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, ModelSettings]:
        messages = [dict(m) for m in state.conversation]  # the LLM's copy; the conversation stays
        if final_round:
            messages.append(_round_cap_message())
        tools = None
        if not final_round:
            own = state.plan.tool_schemas(state.ctx.auth.scopes)
            tools = client_tools.offered_tools(own, state.client_tools) or None
        settings = state.settings.model_copy(deep=True)
        if iteration > 0 and settings.forces_tool:
            settings.tool_choice = "auto"  # forcing every round would loop to the round cap
        data = HookData.model_construct(
            lifecycle=Lifecycle.BEFORE_LLM_CALL, messages=messages, tools=tools, iteration=iteration,
            model_settings=settings,
        )
        data = await self._stage(state, data, f"before_llm_call#{iteration}")
        settings = data.model_settings or ModelSettings()
        messages = list(data.messages or [])
        if await self._compactor.past_hard(messages):  # the in-run safety stop
            outcome = await self._compactor.in_run(messages, state.ctx)
            if outcome is not None:
                messages = _adopt(state, outcome, final_round)
        return messages, data.tools or None, settings

    async def _llm_call(
        self,
        state: RequestState,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        settings: ModelSettings,
        final_round: bool,
    ) -> AsyncGenerator[ChatCompletionChunk, None]:
        """One LLM call (streamed or not); a "context too long" refusal that comes before any
        chunk gets one compaction and one retry, else the error stands. An empty answer under
        `tool_choice: "auto"` (nothing of it reached the client: the adapter held its chunks)
        is asked once more with "none", as `_asked_again` says."""
        retried = False
        while True:
            chunks_before = state.chunks_seen
            try:
                with self._recorded_llm_call(state):
                    if state.stream:
                        async with contextlib.aclosing(
                            self._streamed_llm_call(state, messages, tools, settings)
                        ) as chunks:
                            async for chunk in chunks:
                                yield chunk
                    else:
                        answer = await self.llm.complete(self.model, messages, tools, settings)
                        answer.id = state.completion_id
                        state.last_response = answer
                        if state.plan.hold_back(state.ctx.auth.scopes):
                            state.last_response = await self._guarded_answer(state, answer)
                return
            except ContextTooLong as refusal:
                if retried or state.chunks_seen != chunks_before:
                    raise
                retried = True
                outcome = await self._compactor.after_refusal(messages, refusal, state.ctx)
                if outcome is None:
                    raise
                messages = _adopt(state, outcome, final_round)
            except EmptyAnswer as empty:
                if not empty.under_auto:
                    raise
                settings = _asked_again(state, empty, settings)

    @contextlib.contextmanager
    def _recorded_llm_call(self, state: RequestState) -> Iterator[None]:
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
            self.runtime.record_call(
                state.completion_id, lifecycle, self.model, (time.perf_counter() - started) * 1000, error
            )

    async def _streamed_llm_call(
        self, state: RequestState, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
        settings: ModelSettings,
    ) -> AsyncGenerator[ChatCompletionChunk, None]:
        """One streamed LLM call; every chunk goes through on_chunk before the client sees it
        (batched when the stage is one remote segment and `chunk_batch` > 1), and through
        the hold-back window when an on_chunk hook asked for one
        (hookbus.services.orchestrator.streaming.hold_back)."""
        chunks = stream_chunks(
            state, self.llm.stream(self.model, messages, tools, settings), self.model,
            self._on_chunk, self._on_chunks, self._chunk_batch,
        )
        async with contextlib.aclosing(chunks) as visible:
            async for chunk in visible:
                yield chunk

    async def _guarded_answer(self, state: RequestState, answer: ChatCompletion) -> ChatCompletion:
        """A non-streamed answer judged by the on_chunk hooks that hold text back: a client
        that asked for no stream would otherwise get what those guards keep from a stream.
        The answer goes through them as a stream of one chunk holding all of it (their
        window is the whole text), so a refusal is the same error and a rewrite reaches
        the answer; the other on_chunk hooks and observers run for streams only, as they
        always did."""
        judging = dataclasses.replace(state, plan=state.plan.windowed())
        chunks = stream_chunks(
            judging, _as_stream(whole_answer_chunk(answer)), self.model,
            self._on_chunk, self._on_chunks, self._chunk_batch,
        )
        async with contextlib.aclosing(chunks) as judged:
            async for _ in judged:
                pass
        state.chunks_seen = judging.chunks_seen
        assert judging.last_response is not None
        return judging.last_response

    async def _on_chunk(self, state: RequestState, given: ChunkIn) -> Judged:
        scopes = state.ctx.auth.scopes
        if state.observations is not None and not state.plan.segments(Lifecycle.ON_CHUNK, scopes):
            # only observers: nothing runs on the chunk's path, they get the chunk as it came
            key = f"on_chunk#{given.index}"
            state.observations.record(state.plan.observers(Lifecycle.ON_CHUNK, scopes), given, key, time.time())
            return Judged(given.chunk, given.held)
        data = await self._stage(state, given.data(), f"on_chunk#{given.index}")
        return _judged(data, given.content)

    async def _on_chunks(
        self, state: RequestState, chunks: Sequence[ChunkIn]
    ) -> tuple[list[Judged], HookbusError | None]:
        """Several chunks through the one remote on_chunk segment in one hop."""
        (segment,) = state.plan.segments(Lifecycle.ON_CHUNK, state.ctx.auth.scopes)
        began = time.time()
        with tracing.stage_span(Lifecycle.ON_CHUNK, f"on_chunk#{chunks[0].index}"):
            started = time.perf_counter()
            result = await self.runtime.hop_chunks(segment, chunks, state.ctx)
            self.runtime.record_stage(
                state.completion_id, Lifecycle.ON_CHUNK, segment.group, result.outcomes,
                (time.perf_counter() - started) * 1000,
            )
        shown = result.data[:-1] if result.abort is not None else result.data
        observers = state.plan.observers(Lifecycle.ON_CHUNK, state.ctx.auth.scopes)
        if observers and state.observations is not None:
            for d, c in zip(shown, chunks, strict=False):
                if d is not None and d.full_content is None:  # a changed chunk comes back without it
                    d.set_internal(full_content=c.full)
                state.observations.record(observers, c if d is None else d, f"on_chunk#{c.index}", began)
        return [
            Judged(c.chunk) if d is None else _judged(d, c.content) for d, c in zip(shown, chunks, strict=False)
        ], result.abort

    async def _after_llm_call(self, state: RequestState, iteration: int) -> dict[str, Any]:
        response = state.last_response
        assert response is not None
        state.usage = add_usage(state.usage, response.usage)
        data = HookData.model_construct(
            lifecycle=Lifecycle.AFTER_LLM_CALL, response=response, usage=response.usage, iteration=iteration
        )
        data = await self._stage(state, data, f"after_llm_call#{iteration}")
        state.last_response = data.response or response
        message = client_tools.conversation_message(state.last_response.choices[0].message)
        state.conversation.append(message)
        return message

    async def _tool_round(self, state: RequestState, message: dict[str, Any]) -> list[dict[str, Any]]:
        """Every tool call of one response, in the model's order: the server's run (with
        their hooks), the client's go through before_toolcall and are returned. Returns the
        calls for the client; the server's results are held for its next request."""
        names = client_tools.client_tool_names(state.client_tools)
        returned: list[dict[str, Any]] = []
        results_at = len(state.conversation)
        for position, tool_call in enumerate(message["tool_calls"]):
            if client_tools.call_name(tool_call) in names:
                passed = await self._client_tool_call(state, tool_call)
                if passed is not None:
                    message["tool_calls"][position] = passed
                    returned.append(passed)
            else:
                await self._tool_round_call(state, tool_call)
        if returned:
            await client_tools.hold_results(
                self.runtime, state.ctx.auth.peer_user_id, message, returned,
                state.conversation[results_at:],
            )
        return returned

    async def _client_tool_call(self, state: RequestState, tool_call: dict[str, Any]) -> dict[str, Any] | None:
        """before_toolcall for a call the client will run: the (maybe rewritten) call to
        return, or None when a hook blocked or skipped it (then it is answered here, as a
        server call would be, and after_toolcall runs)."""
        tool_id = str(tool_call.get("id", ""))
        before = await self._before_toolcall(state, tool_call, tool_id, client=True)
        if not before.tool_skipped:
            return before.tool_call or tool_call
        await self._after_toolcall(state, before, tool_id, before.tool_result or "")
        return None

    async def _before_toolcall(
        self, state: RequestState, tool_call: dict[str, Any], tool_id: str, *, client: bool
    ) -> HookData:
        before = HookData.model_construct(
            lifecycle=Lifecycle.BEFORE_TOOLCALL, tool_call=copy.deepcopy(tool_call), tool_id=tool_id,
            tool_skipped=False, client_tool=client,
        )
        return await self._stage(state, before, f"before_toolcall#{tool_id}")

    async def _tool_round_call(self, state: RequestState, tool_call: dict[str, Any]) -> None:
        tool_id = str(tool_call.get("id", ""))
        before = await self._before_toolcall(state, tool_call, tool_id, client=False)
        if before.tool_skipped:
            result = before.tool_result or ""
        else:
            name = client_tools.call_name(before.tool_call or tool_call)
            self._progress(state, f"hookbus: tool {name} running")
            result = await self._run_tool(state, before.tool_call or tool_call)
            self._progress(state, f"hookbus: tool {name} done")
        await self._after_toolcall(state, before, tool_id, result)

    async def _after_toolcall(self, state: RequestState, before: HookData, tool_id: str, result: str) -> None:
        after = HookData.model_construct(
            lifecycle=Lifecycle.AFTER_TOOLCALL, tool_call=before.tool_call, tool_id=tool_id,
            tool_result=result, tool_skipped=before.tool_skipped, client_tool=before.client_tool,
        )
        after = await self._stage(state, after, f"after_toolcall#{tool_id}")
        state.conversation.append(
            {"role": "tool", "tool_call_id": tool_id, "content": after.tool_result or ""}
        )

    def _progress(self, state: RequestState, line: str) -> None:
        if state.stream and state.on_progress is not None:
            state.on_progress(line)

    async def _run_tool(self, state: RequestState, tool_call: dict[str, Any]) -> str:
        """The tool's result, or the problem that stopped it as an `Error: ...` result."""
        function = tool_call.get("function") or {}
        name = str(function.get("name", ""))
        with tracing.tool_span(name, str(tool_call.get("id", "")), function.get("arguments")) as span:
            started = time.perf_counter()
            try:
                result, problem = await self._call_tool(state, name, function.get("arguments")), None
            except ToolProblem as exc:
                span.error(exc, "tool_error")
                result, problem = f"Error: {exc}", str(exc)
            span.result(result)
        self.runtime.record_call(
            state.completion_id, "tool_call", name, (time.perf_counter() - started) * 1000, problem
        )
        return result

    async def _call_tool(self, state: RequestState, name: str, raw_arguments: Any) -> str:
        tool = state.plan.tools.get(name)
        if tool is None or not state.ctx.allows(tool.descriptor.scope):
            # only what this caller may call: a scoped tool's name is not for everyone
            visible = (n for n, t in state.plan.tools.items() if state.ctx.allows(t.descriptor.scope))
            known = ", ".join(sorted(visible)) or "none"
            raise ToolProblem(f"unknown tool {name!r}; available tools: {known}")
        arguments = parse_arguments(name, raw_arguments)
        if tool.local is not None:
            return await invoke_tool(tool.local, arguments, state.ctx)
        return await self.runtime.call_tool(tool, arguments, state.ctx)

    async def _on_message(self, state: RequestState) -> None:
        data = HookData.model_construct(lifecycle=Lifecycle.ON_MESSAGE, messages=state.conversation)
        data = await self._stage(state, data)
        state.conversation = list(data.messages or [])
        state.result = self._final_completion(state)

    async def _finalize_shielded(self, state: RequestState) -> None:
        """Run finalize to its end even if the caller cancels us again meanwhile."""
        task = asyncio.ensure_future(self._finalize(state))
        cancelled = False
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                cancelled = True
        if cancelled and state.error is None:
            state.error = Cancelled()

    async def _finalize(self, state: RequestState) -> None:
        if not await self._still_ours(state):
            log.warning("finalize_skipped_lost_request", completion_id=state.completion_id)
            return
        data = HookData.model_construct(
            lifecycle=Lifecycle.FINALIZE_CONNECTION,
            messages=state.conversation,
            usage=state.usage,
            error=state.error,
        )
        try:
            await self._stage(state, data)
        except Exception:  # noqa: BLE001 - never replaces the original error
            log.exception("finalize_failed", completion_id=state.completion_id)
        if state.observations is not None:
            state.observations.close()
        if state.ctx.session.id:
            try:
                await self.runtime.save_session(
                    state.ctx.auth.peer_user_id, state.ctx.session.id, state.ctx.session.data
                )
            except Exception:  # noqa: BLE001
                log.exception("session_save_failed", completion_id=state.completion_id)
        log.debug(
            "request_finished",
            completion_id=state.completion_id,
            error=state.error.code if state.error else None,
            ms=round((time.perf_counter() - state.started) * 1000, 2),
        )

    def _stop_error(self, state: RequestState) -> HookbusError | None:
        """Why the runtime stopped this run, when it did and not for the client (an
        orchestrator whose Redis lost the request's state); None for an in-process run."""
        check = getattr(self.runtime, "stop_error", None)
        return None if check is None else check(state.ctx)

    async def _still_ours(self, state: RequestState) -> bool:
        """Whether this process may still finalize the request: an orchestrator that
        stalled and was fenced out (a peer claimed the request and finalized it) must not
        run finalize_connection again when it wakes. Asked of the runtime right before
        finalize; in-process runs always own theirs. A check that fails says yes:
        finalize must run at least once (every write after it is fenced anyway)."""
        check = getattr(self.runtime, "still_owner", None)
        if check is None:
            return True
        try:
            return bool(await check(state.ctx))
        except Exception:  # noqa: BLE001 - never the reason finalize is skipped
            log.exception("ownership_check_failed", completion_id=state.completion_id)
            return True

    # ---------------------------------------------------------------- machinery

    async def _on_compaction(self, outcome: Compaction, ctx: Context | None) -> None:
        """The on_compaction stage, run like any other (hooks in-process and in worker groups
        in one priority order, the runner's rules; at a notification point a failure is
        recorded, never raised). Between turns (`ctx` None) the hooks get a context of no
        request, named after the compaction."""
        between_turns = ctx is None
        if ctx is None:
            ctx = Context(metadata=Metadata(
                completion_id=between_turns_id(outcome.id), model=self.model, agent_name=self.name
            ))
        data = HookData.model_construct(
            lifecycle=Lifecycle.ON_COMPACTION, compaction=outcome, between_turns=between_turns
        )
        try:
            await self._run_stage(self.plan(), ctx, data, f"{Lifecycle.ON_COMPACTION}:{outcome.id}")
        except Exception:  # noqa: BLE001 - telling hooks never breaks the run or the caller
            log.exception("on_compaction_failed", completion_id=ctx.completion_id)

    async def _stage(self, state: RequestState, data: HookData, stage_key: str = "") -> HookData:
        """Run the stage's hooks (`_run_stage`), then hand its end to its observers, if it has
        any (hookbus.services.orchestrator.loop.observer_handoff: they run off the request's path)."""
        observers = state.plan.observers(data.lifecycle, state.ctx.auth.scopes)
        if not observers or state.observations is None:
            return await self._run_stage(state.plan, state.ctx, data, stage_key)
        started = time.time()
        data = await self._run_stage(state.plan, state.ctx, data, stage_key)
        state.observations.record(observers, data, stage_key or data.lifecycle, started)
        return data

    async def _run_stage(self, plan: HookPlan, ctx: Context, data: HookData, stage_key: str = "") -> HookData:
        """Run every hook of data.lifecycle in order, segment by segment; consecutive
        remote segments through the runtime's `hop_segments`, so that a worker can send the
        stage on to the next group itself (hookbus.bus.hops.send_on)."""
        lifecycle = data.lifecycle
        segments = plan.segments(lifecycle, ctx.auth.scopes)
        if not segments:
            return data
        key = stage_key or lifecycle
        with tracing.stage_span(lifecycle, stage_key):
            # a run of remote segments, or one in-process segment (its hooks are all together)
            for _, run in groupby(segments, key=lambda segment: segment.group is None):
                batch = tuple(run)
                started = time.perf_counter()
                if len(batch) > 1:
                    async with contextlib.aclosing(self.runtime.hop_segments(batch, data, ctx, key)) as results:
                        position = 0
                        async for result in results:
                            data = result.data
                            if not self._goes_on(ctx, batch[position], result, started):
                                return data
                            position += 1
                            started = time.perf_counter()
                    continue
                segment = batch[0]
                if segment.group is None:
                    result = await run_hooks(
                        segment.local_hooks(), data, ctx, stage_key=key, observe=tracing.hook_observer()
                    )
                else:  # nothing to send on to: a plain hop, without the generator
                    result = await self.runtime.hop(segment, data, ctx, key)
                data = result.data
                if not self._goes_on(ctx, segment, result, started):
                    return data
        return data

    def _goes_on(self, ctx: Context, segment: Segment, result: ChainResult, started: float) -> bool:
        """Record a segment's outcomes; whether the stage goes on after it (raises the
        abort that ends the run)."""
        lifecycle = result.data.lifecycle
        self.runtime.record_stage(
            ctx.completion_id, lifecycle, segment.group, result.outcomes, (time.perf_counter() - started) * 1000
        )
        if stage_goes_on(lifecycle, result.abort is not None, result.blocked):
            return True
        if result.abort is not None and lifecycle not in NOTIFICATIONS:
            raise result.abort
        return False

    def _conversation(self, messages: Sequence[dict[str, Any]] | str) -> list[dict[str, Any]]:
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        conversation = [
            copy.deepcopy(m if isinstance(m, dict) else m.model_dump(exclude_none=True))
            for m in messages
        ]
        if self.instructions:
            return with_instructions(self.instructions, conversation)
        return conversation

    def _final_completion(self, state: RequestState) -> ChatCompletion:
        response = state.last_response
        assert response is not None
        final = response.model_copy(deep=True)
        final.id = state.completion_id
        final.model = self.model
        final.usage = state.usage
        last = next((m for m in reversed(state.conversation) if m.get("role") == "assistant"), None)
        content = last.get("content") if last is not None else final.choices[0].message.content
        final.choices[0] = final.choices[0].model_validate(
            {
                "index": 0,
                "message": client_tools.returned_message(content, state.client_calls),
                "finish_reason": self._finish_reason(state),
                "logprobs": final.choices[0].logprobs,
            }
        )
        return final

    def _finish_reason(self, state: RequestState) -> str:
        """The turn's one finish_reason: tool_calls only for calls the client must run."""
        if state.client_calls:
            return "tool_calls"
        reason = state.last_response.choices[0].finish_reason if state.last_response else None
        return "stop" if reason in (None, "tool_calls", "function_call") else reason

    def _usage_chunk(self, state: RequestState) -> ChatCompletionChunk:
        return ChatCompletionChunk.model_validate(
            {
                "id": state.completion_id,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": self.model,
                "choices": [],
                "usage": state.usage.model_dump() if state.usage else None,
            }
        )


def _judged(data: HookData, content: str) -> Judged:
    """The chunk the client gets after on_chunk (hooks that changed `content` change its
    text), and the held text as the hooks left it."""
    if data.chunk is not None and data.content != content and data.chunk.choices:
        data.chunk.choices[0].delta.content = data.content
    return Judged(data.chunk, data.held)


async def _as_stream(chunk: ChatCompletionChunk) -> AsyncGenerator[ChatCompletionChunk, None]:
    yield chunk


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
