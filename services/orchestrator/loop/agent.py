"""`Agent`: a model, instructions and skills, and what a caller asks of them.

The loop itself (hookbus.services.orchestrator.loop: the lifecycle walk and its stages)
lives in the modules beside this one; an agent holds no per-request state.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionChunk

from hookbus.bus.settings import OFFLINE_MODEL, get_settings
from hookbus.services.orchestrator.compaction.compactor import Compactor
from hookbus.services.orchestrator.compaction.rules import Compaction, CompactionPolicy
from hookbus.services.orchestrator.llm.client import LLM
from hookbus.services.orchestrator.loop.finalize import finalize_alone
from hookbus.services.orchestrator.loop.observer_handoff import LocalObservers
from hookbus.services.orchestrator.loop.plan import HookPlan
from hookbus.services.orchestrator.loop.request_run import (
    begin,
    lifecycle,
    request_options,
    streamed,
)
from hookbus.services.orchestrator.loop.runtime import LocalRuntime, Runtime
from hookbus.services.orchestrator.loop.stage_runner import on_compaction
from hookbus.skills import AuthInfo, HookbusError, Skill
from hookbus.skills.model_settings import ModelSettings, as_model_settings

_SERVED_BY: ContextVar[tuple[Agent, Runtime] | None] = ContextVar("hookbus_served_by", default=None)
"""The agent and the runtime of the orchestrator service running the current request
(`Agent.serving_on`)."""

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
    streaming.chunk_pipeline: each hop takes the chunks that arrived while the previous one was in
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
        self.compactor = Compactor(self.llm, self.model, functools.partial(on_compaction, self), compaction_policy)
        """The agent's compaction (hookbus.services.orchestrator.compaction.compactor), in runs
        and between turns."""
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
        state = await begin(self, messages, auth, session_id, completion_id, metadata, stream=False)
        request_options(self, state, tools, model_settings, deadline, None)
        async for _ in lifecycle(self, state):
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
        streaming.turn_stream): one role delta, the text of every round, tool-call deltas only for
        the client's tools, then exactly one chunk with the finish_reason. The last chunk
        has no choices and carries the usage summed over every LLM call. Stopping early
        (`aclose()`) ends the request; finalize_connection still runs. `on_progress` is
        told, in one line, when a server-side tool starts and ends (the gateway shows
        these as SSE comments). The other options are `run`'s.
        """
        return streamed(
            self,
            functools.partial(begin, self, messages, auth, session_id, completion_id, metadata, stream=True),
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
        state = await begin(self, messages, auth, session_id, completion_id, metadata, stream=False)
        state.ctx.recovery = recovery
        state.error = error
        await finalize_alone(self, state)

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
        return self.compactor.policy

    @compaction_policy.setter
    def compaction_policy(self, policy: CompactionPolicy) -> None:
        self.compactor.policy = policy

    @property
    def last_compaction(self) -> Compaction | None:
        """The last compaction outcome that changed something (any request, or between turns)."""
        return self.compactor.last

    @property
    def context_window(self) -> int:
        """Tokens compaction budgets against: the policy's `window`, else the model's."""
        return self.compactor.window

    async def compact_if_needed(
        self, messages: Sequence[Mapping[str, Any]], tokens_of_next_message: int
    ) -> Compaction:
        """Between turns: compact when `messages` plus the next message would pass `at`.

        `messages` is never changed; keep `outcome.messages` when `outcome.stage != "none"`.
        """
        return await self.compactor.between_turns(messages, tokens_of_next_message)

    async def compact(
        self, messages: Sequence[Mapping[str, Any]], focus: str | None = None
    ) -> Compaction:
        """Compact now, whatever the size: everything before the latest exchange becomes one
        summary, steered by `focus`. `messages` is never changed."""
        return await self.compactor.now(messages, focus)

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
