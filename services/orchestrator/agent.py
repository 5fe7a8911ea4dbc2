"""The agent loop: one request, top to bottom, in lifecycle order.

    on_connection
    per round:  before_llm_call -> LLM call (on_chunk per chunk) -> after_llm_call
                per tool call:  before_toolcall -> tool -> after_toolcall
    on_message
    finalize_connection          (exactly once, on every path)

Each lifecycle point is fired in one place below. Where a hook runs (this process or a
worker group) is the runtime's business, never the loop's.

Compaction (hookbus.services.orchestrator.compaction) keeps a conversation inside the model's
context window. Between turns the host calls `compact_if_needed` / `compact`; inside a
run, after `before_llm_call`, messages past the policy's `hard` threshold are compacted
by `compact_in_run` (the turn in progress stays whole) and the compacted conversation
replaces the run's own, so later rounds do not grow back. An endpoint that still answers
"context too long" gets one compaction and one retry. The summary is one plain LLM call
(`policy.model` or the agent's model): no hooks, not streamed, not a tool round, and its
usage is not added to the request's. Every skill defining `on_compaction(outcome, ctx)`
(in-process, or hosted by a worker group through the runtime) hears of each compaction
that changed something; `ctx` is None between turns.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import inspect
import re
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from hookbus.bus.settings import get_settings
from hookbus.services.orchestrator import compaction
from hookbus.services.orchestrator.assemble import ChunkAssembler, add_usage
from hookbus.services.orchestrator.compaction import Compaction, CompactionPolicy, Summarizer
from hookbus.services.orchestrator.llm import LLM, ContextTooLong
from hookbus.services.orchestrator.plan import HookPlan
from hookbus.services.orchestrator.runtime import LocalRuntime, Runtime
from hookbus.services.orchestrator.tokens import context_window, count_messages
from hookbus.skills import AuthInfo, Context, HookData, HookError, Skill
from hookbus.skills.context import Metadata, Session
from hookbus.skills.errors import as_hook_error
from hookbus.skills.runner import run_hooks
from hookbus.skills.toolcall import ToolProblem, invoke_tool, parse_arguments

log = structlog.get_logger("hookbus.agent")

ROUND_CAP_NOTE = (
    "You have used every tool round allowed for this request. Do not call tools; "
    "answer now with what you have."
)
_REFUSAL_NUMBERS = re.compile(
    r"maximum context length is (\d+) tokens.*?(?:resulted in|requested) (\d+) tokens",
    re.IGNORECASE | re.DOTALL,
)
_REFUSAL_SHRINK = 0.9
"""Assumed ratio of the endpoint's window to our count when its refusal names no numbers."""


@dataclass
class _ChunkHop:
    """One pipelined on_chunk hop: its inputs, the state it was sent with, its future."""

    chunk: ChatCompletionChunk
    content: str
    index: int
    full: str
    state: dict[str, Any]
    session: dict[str, Any]
    future: asyncio.Future[ChatCompletionChunk | None] | None = None
    ctx: Context | None = None


@dataclass
class RunState:
    """One request's state as it moves through the lifecycle."""

    ctx: Context
    plan: HookPlan
    conversation: list[dict[str, Any]]
    stream: bool
    usage: CompletionUsage | None = None
    chunks_seen: int = 0
    last_response: ChatCompletion | None = None
    result: ChatCompletion | None = None
    error: HookError | None = None
    started: float = field(default_factory=time.perf_counter)

    @property
    def completion_id(self) -> str:
        return self.ctx.metadata.completion_id


class Agent:
    """An agent: a model, instructions, skills; `run` or `run_stream` one request at a time or many.

    An agent holds no per-request state, so one instance serves concurrent requests and
    may be used from several event loops one after another.

    `chunk_window`: how many on_chunk hops of one request may be in flight at once when
    every on_chunk hook is remote (see `_streamed_llm_call`). 1 (the default) sends them one
    at a time: pipelining is opt-in (`agent.chunk_window = 64`) until it has a longer record
    (a shutdown stall seen with it came from redis-py swallowing a cancel, now handled).
    """

    chunk_window: int = 1

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
    ) -> None:
        if max_tool_rounds < 0:
            raise ValueError("max_tool_rounds must be >= 0")
        self.name = name
        self.llm = llm or LLM()
        self.model = model or get_settings().model or "offline"
        self.compaction_policy = compaction_policy or CompactionPolicy()
        self.last_compaction: Compaction | None = None
        self.instructions = instructions
        self.skills: list[Skill] = [s() if isinstance(s, type) else s for s in skills]
        self.max_tool_rounds = max_tool_rounds
        self.runtime: Runtime = runtime or LocalRuntime()
        self._local_hooks = [h for skill in self.skills for h in skill.bound_hooks()]
        self._local_tools = [t for skill in self.skills for t in skill.bound_tools()]
        self._plan: HookPlan | None = None
        self._plan_version = -1

    # ----------------------------------------------------------------- public API

    async def run(
        self,
        messages: Sequence[dict[str, Any]] | str,
        auth: AuthInfo | dict[str, Any] | None = None,
        session_id: str | None = None,
        *,
        completion_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> ChatCompletion:
        """Run one request to its end; raises the HookError that aborted it."""
        state = await self._begin(messages, auth, session_id, completion_id, metadata, stream=False)
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
    ) -> AsyncIterator[ChatCompletionChunk]:
        """An async generator of the chunks the client sees, as the hooks made them.

        The last chunk has no choices and carries the usage summed over every LLM call.
        Stopping early (`aclose()`) ends the request; finalize_connection still runs.
        """
        return self._stream(messages, auth, session_id, completion_id, metadata)

    async def finalize_only(
        self,
        messages: Sequence[dict[str, Any]] | str,
        *,
        completion_id: str,
        error: HookError,
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
                state.ctx.session.data = await self.runtime.load_session(state.ctx.session.id)
            except Exception:  # noqa: BLE001 - finalize runs even without the session
                log.exception("session_load_failed", completion_id=state.completion_id)
        await self._finalize_shielded(state)

    # ---------------------------------------------------------------- compaction

    @property
    def compaction_policy(self) -> CompactionPolicy:
        """The policy in force; replace it as a whole (it is frozen), e.g.
        `agent.compaction_policy = CompactionPolicy(at=0.7)`."""
        return self._compaction_policy

    @compaction_policy.setter
    def compaction_policy(self, policy: CompactionPolicy) -> None:
        if not isinstance(policy, CompactionPolicy):
            raise TypeError(
                f"compaction_policy must be a CompactionPolicy, not {type(policy).__name__}"
            )
        policy.resolve(context_window(self.model))  # refuse one that cannot work for this model
        self._compaction_policy = policy

    @property
    def context_window(self) -> int:
        """Tokens compaction budgets against: the policy's `window`, else the model's."""
        return self._compaction_policy.window or context_window(self.model)

    async def compact_if_needed(
        self, messages: Sequence[Mapping[str, Any]], tokens_of_next_message: int
    ) -> Compaction:
        """Between turns: compact when `messages` plus the next message would pass `at`.

        `messages` is never changed; keep `outcome.messages` when `outcome.stage != "none"`.
        """
        policy = self._compaction_policy
        outcome = await compaction.compact_if_needed(
            _plain(messages), tokens_of_next_message, policy, self.context_window,
            self._summarizer(policy),
        )
        await self._compacted(outcome, None)
        return outcome

    async def compact(
        self, messages: Sequence[Mapping[str, Any]], focus: str | None = None
    ) -> Compaction:
        """Compact now, whatever the size: everything before the latest exchange becomes one
        summary, steered by `focus`. `messages` is never changed."""
        policy = self._compaction_policy
        outcome = await compaction.compact(
            _plain(messages), policy, self.context_window, self._summarizer(policy), focus=focus
        )
        await self._compacted(outcome, None)
        return outcome

    def _summarizer(self, policy: CompactionPolicy) -> Summarizer:
        model = policy.model or self.model

        async def summarize(request: list[dict[str, Any]]) -> str:
            # A plain call: no hooks, not streamed, not a tool round, usage not counted.
            response = await self.llm.complete(model, request, None)
            return (response.choices[0].message.content or "") if response.choices else ""

        return summarize

    async def _compacted(self, outcome: Compaction, ctx: Context | None) -> None:
        """Record a compaction and tell every skill that handles it; failures are only logged."""
        if outcome.stage == "none":
            return
        self.last_compaction = outcome
        completion_id = ctx.completion_id if ctx is not None else None
        log.info(
            "compacted", completion_id=completion_id, stage=outcome.stage,
            before=outcome.before, after=outcome.after, window=outcome.window,
        )
        for skill in self.skills:
            if not skill.handles_compaction():
                continue
            try:
                result = skill.on_compaction(outcome, ctx)  # type: ignore[attr-defined]
                if inspect.isawaitable(result):
                    await result
            except Exception:  # noqa: BLE001 - a listener never breaks the run
                log.exception("on_compaction_failed", skill=skill.name, completion_id=completion_id)
        notify = getattr(self.runtime, "notify_compaction", None)
        if notify is not None:
            try:
                await notify(outcome, ctx)
            except Exception:  # noqa: BLE001
                log.exception("on_compaction_failed", group="*", completion_id=completion_id)

    async def _compact_in_run(
        self,
        state: RunState,
        messages: list[dict[str, Any]],
        final_round: bool,
        policy: CompactionPolicy,
        window: int,
    ) -> list[dict[str, Any]] | None:
        """Compact the messages about to go to the LLM, keeping the turn in progress whole.

        The result also becomes the run's conversation (without the round-cap note).
        Returns the messages to send, or None when nothing changed.
        """
        outcome = await compaction.compact_in_run(
            messages, policy, window, self._summarizer(policy), _turn_start(messages)
        )
        if outcome.stage == "none":
            return None
        compacted = copy.deepcopy(outcome.messages)
        conversation = copy.deepcopy(outcome.messages)
        if final_round and conversation and conversation[-1] == _round_cap_message():
            conversation.pop()
        state.conversation = conversation
        await self._compacted(outcome, state.ctx)
        return compacted

    async def _compact_after_refusal(
        self,
        state: RunState,
        messages: list[dict[str, Any]],
        final_round: bool,
        refusal: ContextTooLong,
    ) -> list[dict[str, Any]] | None:
        """The endpoint said the prompt is too long although our count said it fits: compact
        against the window the refusal implies (scaled to our count), once."""
        policy = self._compaction_policy
        ours = count_messages(messages)
        numbers = _REFUSAL_NUMBERS.search(refusal.message or "")
        ratio = _REFUSAL_SHRINK
        if numbers and int(numbers[2]) > int(numbers[1]) > 0:
            ratio = int(numbers[1]) / int(numbers[2])
        try:
            resolved = policy.resolve(self.context_window)
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
            "context_too_long_compacting", completion_id=state.completion_id,
            counted=ours, window=window,
        )
        return await self._compact_in_run(state, messages, final_round, tighter, window)

    def plan(self) -> HookPlan:
        """The merged hook order; rebuilt only when the runtime's remote set changed."""
        version = self.runtime.remote_version()
        if self._plan is None or version != self._plan_version:
            self._plan = HookPlan.build(
                self._local_hooks,
                self._local_tools,
                self.runtime.remote_hooks(),
                self.runtime.remote_tools(),
            )
            self._plan_version = version
        return self._plan

    # ------------------------------------------------------------------ lifecycle

    async def _stream(self, messages, auth, session_id, completion_id, metadata):  # type: ignore[no-untyped-def]
        state = await self._begin(messages, auth, session_id, completion_id, metadata, stream=True)
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
    ) -> RunState:
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
        return RunState(ctx, self.plan(), self._conversation(messages), stream)

    async def _lifecycle(self, state: RunState) -> AsyncGenerator[ChatCompletionChunk, None]:
        """The whole request; a generator so streaming and non-streaming share one path."""
        try:
            if state.ctx.session.id:
                state.ctx.session.data = await self.runtime.load_session(state.ctx.session.id)
            await self._on_connection(state)
            rounds = 0
            while True:
                final_round = rounds >= self.max_tool_rounds
                messages, tools = await self._before_llm_call(state, rounds, final_round)
                async with contextlib.aclosing(
                    self._llm_call(state, messages, tools, final_round)
                ) as chunks:
                    async for chunk in chunks:
                        yield chunk
                message = await self._after_llm_call(state, rounds)
                if final_round or not message.get("tool_calls"):
                    break
                for tool_call in message["tool_calls"]:
                    await self._tool_round_call(state, tool_call)
                rounds += 1
            await self._on_message(state)
            if state.stream:
                yield self._usage_chunk(state)
        except HookError as exc:
            state.error = exc
            raise
        except asyncio.CancelledError:
            state.error = HookError(499, "cancelled", "the request was cancelled")
            raise
        except GeneratorExit:
            state.error = HookError(499, "client_closed", "the client stopped reading")
            raise
        except Exception as exc:
            state.error = as_hook_error(exc)
            log.exception("run_failed", completion_id=state.completion_id)
            raise state.error from exc
        finally:
            await self._finalize_shielded(state)

    async def _on_connection(self, state: RunState) -> None:
        data = HookData.model_construct(
            lifecycle="on_connection", messages=state.conversation, stream=state.stream
        )
        data = await self._stage(state, data)
        state.conversation = list(data.messages or [])

    async def _before_llm_call(
        self, state: RunState, iteration: int, final_round: bool
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        messages = [dict(m) for m in state.conversation]  # the LLM's copy; the conversation stays
        if final_round:
            messages.append(_round_cap_message())
        tools = None if final_round else state.plan.tool_schemas(state.ctx.auth.scopes) or None
        data = HookData.model_construct(
            lifecycle="before_llm_call", messages=messages, tools=tools, iteration=iteration
        )
        data = await self._stage(state, data, f"before_llm_call#{iteration}")
        messages = list(data.messages or [])
        policy = self._compaction_policy
        window = self.context_window
        if count_messages(messages) > policy.resolve(window).hard:  # the in-run safety stop
            compacted = await self._compact_in_run(state, messages, final_round, policy, window)
            if compacted is not None:
                messages = compacted
        return messages, data.tools or None

    async def _llm_call(
        self,
        state: RunState,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        final_round: bool,
    ) -> AsyncGenerator[ChatCompletionChunk, None]:
        """One LLM call (streamed or not); a "context too long" refusal that comes before any
        chunk gets one compaction and one retry, else the error stands."""
        retried = False
        while True:
            chunks_before = state.chunks_seen
            try:
                if state.stream:
                    async with contextlib.aclosing(
                        self._streamed_llm_call(state, messages, tools)
                    ) as chunks:
                        async for chunk in chunks:
                            yield chunk
                else:
                    state.last_response = await self.llm.complete(self.model, messages, tools)
                    state.last_response.id = state.completion_id
                return
            except ContextTooLong as refusal:
                if retried or state.chunks_seen != chunks_before:
                    raise
                retried = True
                compacted = await self._compact_after_refusal(state, messages, final_round, refusal)
                if compacted is None:
                    raise
                messages = compacted

    async def _streamed_llm_call(
        self, state: RunState, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> AsyncGenerator[ChatCompletionChunk, None]:
        """One streamed LLM call; every chunk goes through on_chunk before the client sees it.

        When every on_chunk segment is remote (a worker group), the chunks are pipelined:
        chunk i+1 is sent to the hooks before chunk i's reply is back (up to
        `chunk_window` chunks of this request in flight), and the client still gets the
        results strictly in the model's order. Each chunk's hooks run on a snapshot of
        `ctx.state` / `ctx.session.data` taken when it was sent, so the pipeline is only
        kept while on_chunk hooks leave them unchanged: the first reply that changes them
        is applied, the chunks sent after it (which saw the old state) are sent again,
        one at a time, and the rest of this call runs sequentially as with in-process
        hooks. The first chunk always goes alone, so hooks that keep per-request state
        on every chunk (the built-in ContentFilter, Analytics) are detected on chunk 0 and
        run strictly sequentially from the start. The catch: a hook that starts writing
        `ctx.state` only at a later chunk may already have been called for up to
        `chunk_window - 1` following chunks with the older state; those calls are
        discarded and made again, so such a hook's side effects outside `ctx` can happen
        twice for them. A HookError on chunk i ends the stream at chunk i (the results of
        later chunks already sent are dropped). In-process on_chunk hooks (or a chain
        mixing both) are always called one chunk at a time.
        """
        segments = state.plan.segments("on_chunk", state.ctx.auth.scopes)
        if segments and self.chunk_window > 1 and all(s.group is not None for s in segments):
            async for chunk in self._pipelined_llm_call(state, messages, tools):
                yield chunk
            return
        assembler = ChunkAssembler(state.completion_id, self.model)
        full_content: list[str] = []
        async for chunk in self.llm.stream(self.model, messages, tools):
            chunk.id = state.completion_id
            if chunk.usage is not None:
                assembler.usage = chunk.usage
            content = _chunk_text(chunk)
            if content:
                full_content.append(content)
            if segments:
                visible = await self._on_chunk(
                    state, chunk, content, state.chunks_seen, "".join(full_content)
                )
            else:
                visible = chunk
            state.chunks_seen += 1
            if visible is None or not visible.choices:
                continue  # dropped by a hook, or the usage-only chunk (summed at the end)
            visible.id = state.completion_id
            assembler.add(visible)
            yield visible
        state.last_response = assembler.completion()

    async def _pipelined_llm_call(
        self, state: RunState, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> AsyncGenerator[ChatCompletionChunk, None]:
        """`_streamed_llm_call` with remote on_chunk hops pipelined (see its docstring).

        A producer task reads the model's stream and sends each chunk's hop at once (up to
        `chunk_window` unsettled); this generator settles them in order and yields each as
        soon as it and every earlier one is back."""
        assembler = ChunkAssembler(state.completion_id, self.model)
        ctx = state.ctx
        window = self.chunk_window
        pending: collections.deque[_ChunkHop] = collections.deque()
        wake, room, first_settled = asyncio.Event(), asyncio.Event(), asyncio.Event()
        sequential = False
        finished = False
        failure: BaseException | None = None

        def send(chunk: ChatCompletionChunk, content: str, index: int, full: str) -> _ChunkHop:
            hop = _ChunkHop(chunk, content, index, full, ctx.state, ctx.session.data)
            if not sequential:
                # the hop's own Context: its reply rebinds this copy's state/session, not ctx's
                own = ctx.model_copy(update={"session": ctx.session.model_copy()})
                hop.ctx = own
                hop.future = asyncio.ensure_future(self._on_chunk_in(state, own, chunk, content, index, full))
            return hop

        async def produce() -> None:
            nonlocal finished, failure
            full_content: list[str] = []
            try:
                async with contextlib.aclosing(self.llm.stream(self.model, messages, tools)) as stream:
                    async for chunk in stream:
                        chunk.id = state.completion_id
                        if chunk.usage is not None:
                            assembler.usage = chunk.usage
                        content = _chunk_text(chunk)
                        if content:
                            full_content.append(content)
                        index = state.chunks_seen
                        state.chunks_seen += 1
                        pending.append(send(chunk, content, index, "".join(full_content)))
                        wake.set()
                        if index == 0:  # the first chunk goes alone: it tells whether hooks keep state
                            await first_settled.wait()
                        while len(pending) >= window:
                            room.clear()
                            await room.wait()
            except Exception as exc:  # noqa: BLE001 - handed to the consumer, raised there
                failure = exc
            finally:
                finished = True
                wake.set()

        async def settle(hop: _ChunkHop) -> ChatCompletionChunk | None:
            """Chunk `hop`'s result, in order; sent again alone if it ran on an old state."""
            nonlocal sequential
            if hop.future is None or hop.ctx is None:
                return await self._on_chunk(state, hop.chunk, hop.content, hop.index, hop.full)
            if hop.state is not ctx.state or hop.session is not ctx.session.data:
                hop.future.cancel()
                return await self._on_chunk(state, hop.chunk, hop.content, hop.index, hop.full)
            visible = await hop.future
            own = hop.ctx
            if own.state != ctx.state or own.session.data != ctx.session.data:
                ctx.state = own.state
                ctx.session.data = own.session.data
                sequential = True  # hooks keep state: no more speculation in this call
            return visible

        producer = asyncio.ensure_future(produce())
        try:
            while True:
                if not pending:
                    if finished:
                        break
                    wake.clear()
                    await wake.wait()
                    continue
                hop = pending.popleft()
                room.set()
                try:
                    visible = await settle(hop)
                finally:
                    if hop.index == 0:
                        first_settled.set()
                if visible is None or not visible.choices:
                    continue  # dropped by a hook, or the usage-only chunk (summed at the end)
                visible.id = state.completion_id
                assembler.add(visible)
                yield visible
            if failure is not None:
                raise failure
        finally:
            if not producer.done():
                producer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await producer
            for hop in pending:
                if hop.future is not None:
                    hop.future.cancel()
        state.last_response = assembler.completion()

    async def _on_chunk_in(
        self, state: RunState, ctx: Context, chunk: ChatCompletionChunk, content: str, index: int, full: str
    ) -> ChatCompletionChunk | None:
        """`_on_chunk` with its own Context (a pipelined chunk's snapshot)."""
        own = RunState(ctx, state.plan, state.conversation, state.stream)
        return await self._on_chunk(own, chunk, content, index, full)

    async def _on_chunk(
        self, state: RunState, chunk: ChatCompletionChunk, content: str, index: int, full: str
    ) -> ChatCompletionChunk | None:
        data = HookData.model_construct(
            lifecycle="on_chunk", chunk=chunk, content=content, chunk_index=index, full_content=full
        )
        data = await self._stage(state, data, f"on_chunk#{index}")
        if data.chunk is not None and data.content != content and data.chunk.choices:
            data.chunk.choices[0].delta.content = data.content
        return data.chunk

    async def _after_llm_call(self, state: RunState, iteration: int) -> dict[str, Any]:
        response = state.last_response
        assert response is not None
        state.usage = add_usage(state.usage, response.usage)
        data = HookData.model_construct(
            lifecycle="after_llm_call", response=response, usage=response.usage, iteration=iteration
        )
        data = await self._stage(state, data, f"after_llm_call#{iteration}")
        state.last_response = data.response or response
        message = state.last_response.choices[0].message.model_dump(exclude_none=True)
        message.setdefault("content", None)
        state.conversation.append(message)
        return message

    async def _tool_round_call(self, state: RunState, tool_call: dict[str, Any]) -> None:
        tool_id = str(tool_call.get("id", ""))
        before = HookData.model_construct(
            lifecycle="before_toolcall", tool_call=copy.deepcopy(tool_call), tool_id=tool_id,
            tool_skipped=False,
        )
        before = await self._stage(state, before, f"before_toolcall#{tool_id}")
        if before.tool_skipped:
            result = before.tool_result or ""
        else:
            result = await self._run_tool(state, before.tool_call or tool_call)
        after = HookData.model_construct(
            lifecycle="after_toolcall", tool_call=before.tool_call, tool_id=tool_id,
            tool_result=result, tool_skipped=before.tool_skipped,
        )
        after = await self._stage(state, after, f"after_toolcall#{tool_id}")
        state.conversation.append(
            {"role": "tool", "tool_call_id": tool_id, "content": after.tool_result or ""}
        )

    async def _run_tool(self, state: RunState, tool_call: dict[str, Any]) -> str:
        function = tool_call.get("function") or {}
        name = str(function.get("name", ""))
        tool = state.plan.tools.get(name)
        try:
            if tool is None or not state.ctx.allows(tool.scope):
                known = ", ".join(sorted(state.plan.tools)) or "none"
                raise ToolProblem(f"unknown tool {name!r}; available tools: {known}")
            arguments = parse_arguments(name, function.get("arguments"))
            if tool.local is not None:
                return await invoke_tool(tool.local, arguments, state.ctx)
            return await self.runtime.call_tool(tool, arguments, state.ctx)
        except ToolProblem as exc:
            return f"Error: {exc}"

    async def _on_message(self, state: RunState) -> None:
        data = HookData.model_construct(lifecycle="on_message", messages=state.conversation)
        data = await self._stage(state, data)
        state.conversation = list(data.messages or [])
        state.result = self._final_completion(state)

    async def _finalize_shielded(self, state: RunState) -> None:
        """Run finalize to its end even if the caller cancels us again meanwhile."""
        task = asyncio.ensure_future(self._finalize(state))
        cancelled = False
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                cancelled = True
        if cancelled and state.error is None:
            state.error = HookError(499, "cancelled", "the request was cancelled")

    async def _finalize(self, state: RunState) -> None:
        data = HookData.model_construct(
            lifecycle="finalize_connection",
            messages=state.conversation,
            usage=state.usage,
            error=state.error,
        )
        try:
            await self._stage(state, data)
        except Exception:  # noqa: BLE001 - never replaces the original error
            log.exception("finalize_failed", completion_id=state.completion_id)
        if state.ctx.session.id:
            try:
                await self.runtime.save_session(state.ctx.session.id, state.ctx.session.data)
            except Exception:  # noqa: BLE001
                log.exception("session_save_failed", completion_id=state.completion_id)
        log.debug(
            "request_finished",
            completion_id=state.completion_id,
            error=state.error.code if state.error else None,
            ms=round((time.perf_counter() - state.started) * 1000, 2),
        )

    # ---------------------------------------------------------------- machinery

    async def _stage(self, state: RunState, data: HookData, stage_key: str = "") -> HookData:
        """Run every hook of data.lifecycle in order, segment by segment."""
        lifecycle = data.lifecycle
        for segment in state.plan.segments(lifecycle, state.ctx.auth.scopes):
            started = time.perf_counter()
            if segment.group is None:
                result = await run_hooks(
                    segment.local_hooks(), data, state.ctx, stage_key=stage_key or lifecycle
                )
            else:
                result = await self.runtime.hop(segment, data, state.ctx, stage_key or lifecycle)
            self.runtime.record_stage(
                state.ctx, lifecycle, segment.group, result.outcomes,
                (time.perf_counter() - started) * 1000,
            )
            data = result.data
            if result.abort is not None and lifecycle != "finalize_connection":
                raise result.abort
            if result.blocked:
                break
        return data

    def _conversation(self, messages: Sequence[dict[str, Any]] | str) -> list[dict[str, Any]]:
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        conversation = [
            copy.deepcopy(m if isinstance(m, dict) else m.model_dump(exclude_none=True))  # type: ignore[attr-defined]
            for m in messages
        ]
        if self.instructions and not (conversation and conversation[0].get("role") == "system"):
            conversation.insert(0, {"role": "system", "content": self.instructions})
        return conversation

    def _final_completion(self, state: RunState) -> ChatCompletion:
        response = state.last_response
        assert response is not None
        final = response.model_copy(deep=True)
        final.id = state.completion_id
        final.model = self.model
        final.usage = state.usage
        last = state.conversation[-1] if state.conversation else None
        if last is not None and last.get("role") == "assistant":
            final.choices[0].message.content = last.get("content")
        return final

    def _usage_chunk(self, state: RunState) -> ChatCompletionChunk:
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


def _round_cap_message() -> dict[str, Any]:
    return {"role": "system", "content": ROUND_CAP_NOTE}


def _turn_start(messages: Sequence[Mapping[str, Any]]) -> int:
    """Index of the turn in progress: its (last) user message; 0 when there is none."""
    return next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "user"), 0
    )


def _plain(messages: Sequence[Any]) -> list[Mapping[str, Any]]:
    """Messages as mappings (pydantic message objects are dumped); the originals stay as they are."""
    return [m if isinstance(m, Mapping) else m.model_dump(exclude_none=True) for m in messages]


def _chunk_text(chunk: ChatCompletionChunk) -> str:
    if chunk.choices and chunk.choices[0].delta.content:
        return chunk.choices[0].delta.content
    return ""
