"""A run's steps as the loop sees them: those a dead predecessor completed, handed back in
order instead of run again, then those this run completes, put on record
(hookbus.bus.store.run_steps) before the next one starts.

The loop is deterministic given what its steps returned: replaying the records in order
brings it to the step its predecessor was in when it died, with the same conversation,
`ctx.state` and session data; that step and those after it run for real. A step is one
stage's hooks, one LLM call or one tool call; its key says which (`StepRecord.key`). A
record whose key is not the step the loop reached (the run took another path) ends the
replay there: the rest runs.

Messages are recorded as a change to the list the step started from (`changes`): the
messages kept from its start, then the rest, so an unchanged conversation costs a few
bytes a step, not its size.

A stream records up to the LLM call that first answers with text, that call not included:
a takeover from there ends it `orchestrator_lost` if text reached its client (a new call
would not continue it) and otherwise makes that call again, its client having got none of
it; a record of it or of a later step would change neither, at a command each.

The orchestrator service sets `RUN_STEPS` for each run it executes; a run without it
(an agent used in-process) records nothing.
"""

from __future__ import annotations

import copy
import json
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import Any

import structlog

from hookbus.bus.store.run_steps import StepRecord
from hookbus.skills import Context

log = structlog.get_logger("hookbus.agent")

Recorder = Callable[[Sequence[tuple[int, StepRecord]]], Awaitable[bool]]
"""Puts steps of the run on record, each with its number n (from 0), in one command; False
when it could not (Redis unreachable or refusing)."""

CALLS = ("llm_call#", "tool#")
"""The keys of the steps that call out (an LLM call, a tool call): on record as soon as they
end, with the stage records still waiting."""


class RunSteps:
    """The steps of one run: replayed first, then recorded."""

    def __init__(
        self,
        replayed: Sequence[StepRecord] = (),
        record: Recorder | None = None,
        *,
        epoch: int = 0,
        by: str = "",
        resumed: bool = False,
        role_sent: bool = False,
        streamed: bool = False,
    ) -> None:
        """`resumed`: this run took the request over from a lost owner (with or without
        steps to replay). `streamed`: the client reads a stream, so recording ends before the
        LLM call that first answers with text (`done`)."""
        self._replay = deque(replayed)
        self._record = record
        self._waiting: list[tuple[int, StepRecord]] = []
        self.streamed = streamed
        self.epoch = epoch
        self.by = by
        self.role_sent = role_sent
        """A resumed stream's client already got the role delta (it is sent once a turn)."""
        self.resumed = resumed
        self.replayed = 0
        self.recorded = 0
        self._state = "{}"
        self._session = "{}"
        self._worth_storing = False
        """Whether a record waiting would spare a takeover more than free steps (`done`)."""

    @property
    def recording(self) -> bool:
        """Whether steps are put on record (in the orchestrator service, not in-process)."""
        return self._record is not None

    def replay(self, key: str, ctx: Context) -> dict[str, Any] | None:
        """The output of step `key` if a predecessor completed it (with `ctx.state` and the
        session data as they were after it), else None: run it."""
        if not self._replay:
            return None
        record = self._replay[0]
        if record.key != key:
            self.diverged(key, record.key)
            return None
        self._replay.popleft()
        if record.state is not None:
            ctx.state = record.state
            self._state = _dumped(record.state)
        if record.session is not None:
            ctx.session.data = record.session
            self._session = _dumped(record.session)
        self.replayed += 1
        return record.output

    def diverged(self, key: str, recorded: str) -> None:
        """The run reached `key` where the record says `recorded`: run the rest."""
        log.warning("resume_diverged", step=key, recorded=recorded, replayed=self.replayed)
        self._replay.clear()

    def start(self, messages: list[dict[str, Any]], in_process: bool) -> list[dict[str, Any]]:
        """The messages a stage starts from, to record its change to them: a copy when
        in-process hooks run at it (they may change the messages in place), else the list
        (a worker's changes come back as new objects)."""
        if self._record is None:
            return messages
        return copy.deepcopy(messages) if in_process else list(messages)

    def messages(self, key: str, base: list[dict[str, Any]], change: dict[str, Any]) -> list[dict[str, Any]] | None:
        """`base` changed as recorded; None (and the replay ends) when the record was made
        from another list."""
        messages = applied(base, change)
        if messages is None:
            self.diverged(key, "a change to another list of messages")
        return messages

    async def done(self, key: str, output: dict[str, Any], ctx: Context, *, free: bool = False) -> None:
        """Put step `key` on record: its output, and `ctx.state` and the session data if it
        changed them. An LLM call or a tool call is stored before the next step starts; a
        stage's hooks wait for the next store (`calling`, a call's end), so the stages
        between two calls cost one command together. `free`: the step ran no hook and
        called nothing (a stage without hooks for this caller, not compacted), so a
        takeover that runs it again gets the same output at no cost: its record waits
        for the next one worth storing, and goes with it, in order."""
        if self._record is None:
            return
        state, session = _dumped(ctx.state), _dumped(ctx.session.data)
        record = StepRecord(
            key=key, epoch=self.epoch, by=self.by, output=output,
            state=ctx.state if state != self._state else None,
            session=ctx.session.data if session != self._session else None,
        )
        self._state, self._session = state, session
        if self.streamed and streamed_text([record]):
            # its client has this text, or gets it now: a takeover from here ends the
            # stream `orchestrator_lost` if any reached it (serving.execution, `resumption`)
            # and else makes this call again, the client having got none of it; so neither
            # this step nor those after it are worth a command
            self._record = None
            return
        self._waiting.append((self.replayed + self.recorded, record))
        self.recorded += 1
        self._worth_storing = self._worth_storing or not free
        if key.startswith(CALLS):
            await self.calling()

    async def calling(self) -> None:
        """Store the records waiting: a call's own as it ends (from `done`), the stages'
        before an LLM call, a tool call or finalize starts, so a takeover during a call runs
        no stage before it again; nothing when every record waiting is of a free step (a
        plain request's on_connection and before_llm_call: one command fewer)."""
        if self._record is None or not self._worth_storing:
            return
        waiting, self._waiting, self._worth_storing = self._waiting, [], False
        if not await self._record(waiting):
            # a step not on record costs only a takeover's replay; what follows would not
            # fit the record, so none is kept
            self._record = None


def streamed_text(records: Sequence[StepRecord]) -> bool:
    """Whether a recorded LLM call answered with text: in a stream, its client got it (or
    was about to), so a run going on after it would not be unnoticed. A stream's own run no
    longer records such a call (`RunSteps.done`); an orchestrator of an earlier version did."""
    for record in records:
        if record.key.startswith("llm_call#"):
            choices = record.output.get("response", {}).get("choices") or [{}]
            if (choices[0].get("message") or {}).get("content"):
                return True
    return False


def changes(base: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """`after` as a change to `base`: how many of its messages it starts with, then the rest."""
    keep = 0
    for before, now in zip(base, after, strict=False):
        if before is not now and before != now:
            break
        keep += 1
    return {"of": len(base), "keep": keep, "tail": list(after[keep:])}


def applied(base: Sequence[dict[str, Any]], change: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The list `changes` recorded, rebuilt from the same `base`; None if `base` is not
    the list it was recorded from (another length)."""
    if change.get("of") != len(base):
        return None
    return [*base[: change["keep"]], *change["tail"]]


def _dumped(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, default=str)


RUN_STEPS: ContextVar[RunSteps | None] = ContextVar("hookbus_run_steps", default=None)
"""The steps of the run the current task belongs to (set by the orchestrator service)."""
