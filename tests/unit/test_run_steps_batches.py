"""Which steps go to Redis together (hookbus.services.orchestrator.loop.run_steps): an LLM
call or a tool call is stored as soon as it ends; the stage records before it are stored
before it starts, in one command; a stream stores nothing from the call that first
answers with text on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hookbus.bus.store.run_steps import StepRecord
from hookbus.services.orchestrator.loop.run_steps import RunSteps
from hookbus.skills import Context

TOOL_ANSWER = {"response": {"choices": [{"message": {"content": None, "tool_calls": [{"id": "a"}]}}]}}
TEXT_ANSWER = {"response": {"choices": [{"message": {"content": "the answer"}}]}}


class Recorder:
    """Every command the steps would send: the step numbers and keys of each."""

    def __init__(self, refuse_from: int | None = None) -> None:
        self.commands: list[list[tuple[int, str]]] = []
        self.refuse_from = refuse_from

    async def __call__(self, steps: Sequence[tuple[int, StepRecord]]) -> bool:
        if self.refuse_from is not None and len(self.commands) >= self.refuse_from:
            return False
        self.commands.append([(n, record.key) for n, record in steps])
        return True


async def one_tool_round(steps: RunSteps) -> None:
    """The loop's calls for a request with one tool round, in its order."""
    ctx = Context()

    async def stage(key: str) -> None:
        await steps.done(key, {"messages": {}}, ctx)

    async def call(key: str, output: dict[str, Any]) -> None:
        await steps.calling()
        await steps.done(key, output, ctx)

    await stage("on_connection")
    await stage("before_llm_call#0")
    await call("llm_call#0", TOOL_ANSWER)
    await stage("after_llm_call#0")
    await stage("before_toolcall#0:a")
    await call("tool#0:a", {"result": "3"})
    await stage("after_toolcall#0:a")
    await stage("before_llm_call#1")
    await call("llm_call#1", TEXT_ANSWER)
    await stage("after_llm_call#1")
    await stage("on_message")
    await steps.calling()  # finalize starts


CALLS = [
    [(0, "on_connection"), (1, "before_llm_call#0")],
    [(2, "llm_call#0")],
    [(3, "after_llm_call#0"), (4, "before_toolcall#0:a")],
    [(5, "tool#0:a")],
    [(6, "after_toolcall#0:a"), (7, "before_llm_call#1")],
    [(8, "llm_call#1")],
]


async def test_the_stages_between_two_calls_cost_one_command() -> None:
    recorder = Recorder()
    await one_tool_round(RunSteps(record=recorder, epoch=1))
    assert recorder.commands == [*CALLS, [(9, "after_llm_call#1"), (10, "on_message")]]


async def test_a_stream_stores_nothing_from_its_first_text_on() -> None:
    recorder = Recorder()
    await one_tool_round(RunSteps(record=recorder, epoch=1, streamed=True))
    assert recorder.commands == CALLS[:-1]


async def test_a_refused_store_ends_the_record() -> None:
    recorder = Recorder(refuse_from=2)
    steps = RunSteps(record=recorder, epoch=1)
    await one_tool_round(steps)
    assert recorder.commands == CALLS[:2] and not steps.recording


async def test_nothing_is_recorded_in_process() -> None:
    steps = RunSteps()
    await one_tool_round(steps)
    assert not steps.recording and steps.recorded == 0
