"""Bench 6, in-process costs: a local hook call, a stage, the whole loop.

- `hookbus.skills.runner.run_hooks` with N no-op hooks (per hook = time / N), over an on_chunk and
  over a 20-message before_llm_call (run_hooks snapshots the messages before each hook,
  so the data's size shows);
- one stage (`loop.stage_runner.stage`) with 3 local no-op hooks in one segment (plan lookup, run_hooks,
  record_stage);
- `Agent.run` with no hooks against the built-in offline model (real HTTP on loopback:
  dominated by the HTTP round trips, 1 LLM call) and against an in-memory stub LLM (the
  loop's own cost), and the same with 3 no-op hooks per stage (5 stages).

Run alone: `python -m tests.bench.inprocess`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from openai.types.chat import ChatCompletion

from hookbus.services.orchestrator.llm.client import LLM
from tests.bench import payloads
from tests.bench.common import Row, atimeit_us, print_rows, quiet_logs, run_load, scaled

COMPLETION = {
    "id": "chatcmpl-stub",
    "object": "chat.completion",
    "created": 0,
    "model": "offline",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there."}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
}


class StubLLM(LLM):
    """An LLM answering at once from memory (no HTTP): the loop's own cost shows. The real
    class with its calls replaced, so what the agent reads of its LLM besides them (its
    token scale, its windows) is the real one's."""

    def __init__(self) -> None:
        super().__init__("http://stub.invalid/v1", "bench")  # never called

    async def learn_model(self, model: str, *, window: bool) -> int | None:
        return None  # the endpoint says nothing

    async def complete(  # type: ignore[override]
        self, model: str, messages: list[dict[str, Any]], tools: Any, settings: Any = None
    ) -> ChatCompletion:
        return ChatCompletion.model_validate(COMPLETION)

    async def stream(self, model: str, messages: list[dict[str, Any]], tools: Any, settings: Any = None):  # type: ignore[no-untyped-def, override]
        raise NotImplementedError
        yield


def noop_skill(count: int, lifecycles: list[str]):  # type: ignore[no-untyped-def]
    from hookbus.skills import Skill
    from tests.bench.skills import _noop_hooks

    namespace: dict[str, Any] = {"name": f"noop-{count}"}
    for n in range(count):
        _noop_hooks(namespace, lifecycles, 10 + n, f"h{n}")
    return type(f"Noop{count}", (Skill,), namespace)()


async def measure() -> list[Row]:
    quiet_logs()
    from hookbus.services.orchestrator import Agent
    from hookbus.services.orchestrator.loop.request_run import begin
    from hookbus.services.orchestrator.loop.stage_runner import stage
    from hookbus.skills.runner import run_hooks

    rows: list[Row] = []
    print("\n[in-process]")
    for kind in ("on_chunk", "before_llm_call"):
        for count in (1, 10):
            hooks = [h for h in noop_skill(count, [kind]).bound_hooks()]
            data = payloads.KINDS[kind]()
            ctx = payloads.context()
            us = await atimeit_us(lambda: run_hooks(hooks, data, ctx, stage_key=kind))  # noqa: B023
            print(f"  run_hooks {count:>2} no-op hook(s) over {kind:<16} {us:8.2f} us  = {us / count:6.2f} us per hook")
            if count == 10:
                rows.append(Row("in-process", f"local hook call ({kind})", us / count, "us", target="<20",
                                note="run_hooks, 10 no-op hooks / 10"))

    # one stage: one segment of 3 local hooks
    agent = Agent("bench-inproc", llm=StubLLM(), skills=[noop_skill(3, ["on_chunk"])])
    state = await begin(agent, "hi", None, None, None, None, stream=True)
    data = payloads.on_chunk_data()
    stage_us = await atimeit_us(lambda: stage(agent, state, data, "on_chunk#7"))
    print(f"  stage, 3 local no-op hooks (on_chunk)              {stage_us:8.2f} us  = {stage_us / 3:6.2f} us per hook")
    rows.append(Row("in-process", "Agent._stage, 3 local hooks", stage_us, "us", note=f"{stage_us / 3:.1f} us per hook"))
    empty = Agent("bench-inproc-empty", llm=StubLLM())
    state = await begin(empty, "hi", None, None, None, None, stream=True)
    empty_us = await atimeit_us(lambda: stage(empty, state, data, "on_chunk#7"))
    print(f"  stage, no hooks                                    {empty_us:8.2f} us")

    # The whole loop, no hooks: stub LLM vs the offline model over HTTP
    stub_plain = Agent("bench-loop", llm=StubLLM())
    lifecycles = ["on_connection", "before_llm_call", "after_llm_call", "on_message", "finalize_connection"]
    stub_hooked = Agent("bench-loop-hooks", llm=StubLLM(), skills=[noop_skill(3, lifecycles)])
    offline = Agent("bench-loop-offline")
    await offline.run("hello")
    loop_plain = await atimeit_us(lambda: stub_plain.run("hello"), min_seconds=1.0)
    loop_hooked = await atimeit_us(lambda: stub_hooked.run("hello"), min_seconds=1.0)
    http = await run_load(lambda: offline.run("hello"), concurrency=1, total=scaled(300), warmup=20)
    print(f"  Agent.run, no hooks, stub LLM                      {loop_plain:8.1f} us")
    print(f"  Agent.run, 3 hooks x 5 stages, stub LLM           {loop_hooked:8.1f} us  "
          f"(+{(loop_hooked - loop_plain) / 15:.1f} us per hook call)")
    print(http.line("Agent.run, no hooks, offline model over HTTP", "req/s"))
    rows.append(Row("in-process", "Agent.run, no hooks (stub LLM)", loop_plain, "us", note="the loop's own cost"))
    rows.append(Row("in-process", "Agent.run, 15 hook calls (stub LLM)", loop_hooked, "us", loop_plain, "no hooks",
                    note=f"+{(loop_hooked - loop_plain) / 15:.1f} us per hook call"))
    rows.append(Row("in-process", "Agent.run, no hooks (offline model, HTTP) p50", http.p50_ms * 1000, "us",
                    loop_plain, "stub LLM", note="HTTP round trip to the offline model dominates"))
    return rows


async def main() -> list[Row]:
    started = time.perf_counter()
    rows = await measure()
    print_rows(f"in-process ({time.perf_counter() - started:.0f}s)", rows)
    return rows


if __name__ == "__main__":
    asyncio.run(main())
