"""One tool round of the loop: every tool call of one response, in the model's order.

A server tool runs here between before_toolcall and after_toolcall; a client tool goes
through before_toolcall and is returned to the client, which runs it (the server's
results of the same round are held for its next request: hookbus.services.orchestrator.
loop.client_tools). Each hook stage and each tool call is put on record as it ends, and
replayed instead of run again after a takeover (hookbus.services.orchestrator.loop.run_steps).
"""

from __future__ import annotations

import copy
import time
from typing import Any

from hookbus.services.observability import tracing
from hookbus.services.orchestrator.loop import client_tools
from hookbus.services.orchestrator.loop.host import LoopHost
from hookbus.services.orchestrator.loop.request_state import RequestState
from hookbus.services.orchestrator.loop.stage_runner import stage
from hookbus.skills import HookData
from hookbus.skills.context import HookCall
from hookbus.skills.lifecycle import Lifecycle
from hookbus.skills.toolcall import ToolProblem, invoke_tool, parse_arguments


async def tool_round(
    host: LoopHost, state: RequestState, message: dict[str, Any], iteration: int
) -> list[dict[str, Any]]:
    """Every tool call of one response, in the model's order: the server's run (with
    their hooks), the client's go through before_toolcall and are returned. Returns the
    calls for the client; the server's results are held for its next request."""
    names = client_tools.client_tool_names(state.client_tools)
    returned: list[dict[str, Any]] = []
    results_at = len(state.conversation)
    for position, tool_call in enumerate(message["tool_calls"]):
        if client_tools.call_name(tool_call) in names:
            passed = await _client_tool_call(host, state, tool_call, iteration)
            if passed is not None:
                message["tool_calls"][position] = passed
                returned.append(passed)
        else:
            await _server_tool_call(host, state, tool_call, iteration)
    if returned:
        await client_tools.hold_results(
            host.runtime, state.ctx.auth.peer_user_id, message, returned,
            state.conversation[results_at:],
        )
    return returned


async def _client_tool_call(
    host: LoopHost, state: RequestState, tool_call: dict[str, Any], iteration: int
) -> dict[str, Any] | None:
    """before_toolcall for a call the client will run: the (maybe rewritten) call to
    return, or None when a hook blocked or skipped it (then it is answered here, as a
    server call would be, and after_toolcall runs)."""
    tool_id = str(tool_call.get("id", ""))
    before = await _before_toolcall(host, state, tool_call, tool_id, iteration, client=True)
    if not before.tool_skipped:
        return before.tool_call or tool_call
    await _after_toolcall(host, state, before, tool_id, iteration, before.tool_result or "")
    return None


async def _before_toolcall(
    host: LoopHost, state: RequestState, tool_call: dict[str, Any], tool_id: str, iteration: int, *, client: bool
) -> HookData:
    key = f"before_toolcall#{iteration}:{tool_id}"
    if (done := state.steps.replay(key, state.ctx)) is not None:
        return HookData.model_construct(lifecycle=Lifecycle.BEFORE_TOOLCALL, tool_id=tool_id, client_tool=client, **done)
    before = HookData.model_construct(
        lifecycle=Lifecycle.BEFORE_TOOLCALL, tool_call=copy.deepcopy(tool_call), tool_id=tool_id,
        tool_skipped=False, client_tool=client,
    )
    before = await stage(host, state, before, f"before_toolcall#{tool_id}")
    record = {"tool_call": before.tool_call, "tool_skipped": before.tool_skipped, "tool_result": before.tool_result}
    await state.steps.done(key, record, state.ctx)
    return before


async def _server_tool_call(host: LoopHost, state: RequestState, tool_call: dict[str, Any], iteration: int) -> None:
    """A server tool's call: the tool runs with the call's own idempotency key (completion
    id, round, call id), so a call run again after a takeover carries the key it had."""
    tool_id = str(tool_call.get("id", ""))
    before = await _before_toolcall(host, state, tool_call, tool_id, iteration, client=False)
    key = f"tool#{iteration}:{tool_id}"
    if before.tool_skipped:
        result = before.tool_result or ""
    elif (done := state.steps.replay(key, state.ctx)) is not None:
        result = str(done["result"])
    else:
        name = client_tools.call_name(before.tool_call or tool_call)
        _progress(state, f"hookbus: tool {name} running")
        state.ctx.call = HookCall.for_tool(state.completion_id, iteration, tool_id)
        await state.steps.calling()
        result = await _run_tool(host, state, before.tool_call or tool_call)
        _progress(state, f"hookbus: tool {name} done")
        await state.steps.done(key, {"result": result}, state.ctx)
    await _after_toolcall(host, state, before, tool_id, iteration, result)


async def _after_toolcall(
    host: LoopHost, state: RequestState, before: HookData, tool_id: str, iteration: int, result: str
) -> None:
    key = f"after_toolcall#{iteration}:{tool_id}"
    if (done := state.steps.replay(key, state.ctx)) is not None:
        result = str(done["tool_result"])
    else:
        after = HookData.model_construct(
            lifecycle=Lifecycle.AFTER_TOOLCALL, tool_call=before.tool_call, tool_id=tool_id,
            tool_result=result, tool_skipped=before.tool_skipped, client_tool=before.client_tool,
        )
        after = await stage(host, state, after, f"after_toolcall#{tool_id}")
        result = after.tool_result or ""
        await state.steps.done(key, {"tool_result": result}, state.ctx)
    state.conversation.append({"role": "tool", "tool_call_id": tool_id, "content": result})


def _progress(state: RequestState, line: str) -> None:
    if state.stream and state.on_progress is not None:
        state.on_progress(line)


async def _run_tool(host: LoopHost, state: RequestState, tool_call: dict[str, Any]) -> str:
    """The tool's result, or the problem that stopped it as an `Error: ...` result."""
    function = tool_call.get("function") or {}
    name = str(function.get("name", ""))
    with tracing.tool_span(name, str(tool_call.get("id", "")), function.get("arguments")) as span:
        started = time.perf_counter()
        try:
            result, problem = await _call_tool(host, state, name, function.get("arguments")), None
        except ToolProblem as exc:
            span.error(exc, "tool_error")
            result, problem = f"Error: {exc}", str(exc)
        span.result(result)
    host.runtime.record_call(
        state.completion_id, "tool_call", name, (time.perf_counter() - started) * 1000, problem
    )
    return result


async def _call_tool(host: LoopHost, state: RequestState, name: str, raw_arguments: Any) -> str:
    tool = state.plan.tools.get(name)
    if tool is None or not state.ctx.allows(tool.descriptor.scope):
        # only what this caller may call: a scoped tool's name is not for everyone
        visible = (n for n, t in state.plan.tools.items() if state.ctx.allows(t.descriptor.scope))
        known = ", ".join(sorted(visible)) or "none"
        raise ToolProblem(f"unknown tool {name!r}; available tools: {known}")
    arguments = parse_arguments(name, raw_arguments)
    if tool.local is not None:
        return await invoke_tool(tool.local, arguments, state.ctx)
    return await host.runtime.call_tool(tool, arguments, state.ctx)
