"""on_chunk pipelined: the agent sends chunk i+1 to the hooks before chunk i's reply is
back (up to WINDOW chunks in flight per request) and yields the results in order.

A copy of Agent._streamed_llm_call with that one change (services/orchestrator/agent.py
is not touched). What changes for hooks: every chunk still goes through every on_chunk
hook in priority order and the client still gets the chunks in the model's order; but
`ctx.state` written by an on_chunk hook is seen by later chunks only once its reply is
back (today: by the very next chunk), and a HookError raised on chunk i stops the stream
at chunk i, with chunks after it already sent to the hooks (their results dropped).

    hookbus orchestrator --agent tests.bench.experiments.pipelined_chunks:agent
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from typing import Any

from openai.types.chat import ChatCompletionChunk

from hookbus.services.orchestrator.agent import Agent, RunState, _chunk_text
from hookbus.services.orchestrator.assemble import ChunkAssembler

WINDOW = 64


class PipelinedAgent(Agent):
    window = WINDOW
    yield_each = False

    async def _streamed_llm_call(  # type: ignore[override]
        self, state: RunState, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> AsyncIterator[ChatCompletionChunk]:
        segments = state.plan.segments("on_chunk", state.ctx.auth.scopes)
        if not segments:
            async for chunk in super()._streamed_llm_call(state, messages, tools):
                yield chunk
            return
        assembler = ChunkAssembler(state.completion_id, self.model)
        full_content: list[str] = []
        pending: collections.deque[asyncio.Future[ChatCompletionChunk | None]] = collections.deque()
        sent = 0

        def ready(visible: ChatCompletionChunk | None) -> ChatCompletionChunk | None:
            if visible is None or not visible.choices:
                return None  # dropped by a hook, or the usage-only chunk
            visible.id = state.completion_id
            assembler.add(visible)
            return visible

        try:
            async for chunk in self.llm.stream(self.model, messages, tools):
                chunk.id = state.completion_id
                if chunk.usage is not None:
                    assembler.usage = chunk.usage
                content = _chunk_text(chunk)
                if content:
                    full_content.append(content)
                pending.append(
                    asyncio.ensure_future(
                        self._on_chunk(state, chunk, content, state.chunks_seen, "".join(full_content))
                    )
                )
                state.chunks_seen += 1
                first = sent == 0
                sent += 1
                # the first chunk is awaited at once so it reaches the client without waiting
                # for the window to fill; `yield_each` lets every hop go out at once (a
                # buffered HTTP stream does not yield the loop by itself)
                if self.yield_each:
                    await asyncio.sleep(0)
                while pending and (first or pending[0].done() or len(pending) >= self.window):
                    visible = ready(await pending.popleft())
                    if visible is not None:
                        yield visible
            while pending:
                visible = ready(await pending.popleft())
                if visible is not None:
                    yield visible
        finally:
            for future in pending:
                future.cancel()
        state.last_response = assembler.completion()


def agent() -> PipelinedAgent:
    return PipelinedAgent("bench-stream-pipelined")


class FastHopAgent(PipelinedAgent):
    """PipelinedAgent whose bus runtime hops over the split wire format
    (experiments/fast_runtime.py), patched in when the service hands it its runtime."""

    @property  # type: ignore[override]
    def runtime(self) -> Any:
        return self._runtime

    @runtime.setter
    def runtime(self, runtime: Any) -> None:
        from hookbus.bus.settings import get_settings
        from hookbus.services.orchestrator.bus_runtime import BusRuntime
        from tests.bench.experiments.fast_runtime import patch_runtime

        if isinstance(runtime, BusRuntime):
            patch_runtime(runtime, get_settings().redis_url or "")
        self._runtime = runtime


def fast_agent() -> FastHopAgent:
    return FastHopAgent("bench-stream-pipelined-fast")


def agent_yield_each() -> PipelinedAgent:
    agent = PipelinedAgent("bench-stream-pipelined-yield")
    agent.yield_each = True
    return agent
