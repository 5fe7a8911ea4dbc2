"""The requests one orchestrator process runs (or finalizes) right now, by entry and by
completion id; shared by the service (which runs them) and recovery (which claims, renews
and fences them), so neither reaches into the other."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import structlog

from hookbus.bus.store.response_stream import ResponseWriter
from hookbus.skills import Cancelled, HookbusError, ServiceError
from hookbus.skills.lifecycle import Lifecycle

log = structlog.get_logger("hookbus.orchestrator")


@dataclass
class Running:
    """One request this process is running (or finalizing)."""

    stream: str
    """The requests shard the entry is on (entry ids repeat across shards)."""
    entry_id: str
    completion_id: str
    epoch: int = 0
    stage: str = ""
    task: asyncio.Task[Any] | None = None
    fenced: bool = False
    cancel_reason: str | None = None
    stop_error: HookbusError | None = None
    """Why this process stopped the run itself, when not for its client (Redis lost its state)."""
    started: float = field(default_factory=time.perf_counter)
    writer: ResponseWriter | None = None
    """Its response writer, whose last journal write says when the epoch was last ours."""
    owned_at: float | None = None
    """Monotonic time its begin (or claim) that made the epoch ours was sent."""

    def last_owned(self) -> float | None:
        """Monotonic time the last journal write that found the epoch ours was sent: its
        begin or claim, or a later response write (None: none yet)."""
        written = self.writer.owned_at if self.writer is not None else None
        return max((t for t in (self.owned_at, written) if t is not None), default=None)


class RunTable:
    """Running requests by (requests shard, entry id); a duplicate completion id never
    shadows the original's entry."""

    def __init__(self) -> None:
        self._by_entry: dict[tuple[str, str], Running] = {}
        self._by_cid: dict[str, Running] = {}

    def register(self, stream: str, entry_id: str, completion_id: str) -> Running:
        run = Running(stream, entry_id, completion_id)
        self._by_entry[(stream, entry_id)] = run
        self._by_cid.setdefault(completion_id, run)
        return run

    def unregister(self, run: Running) -> None:
        if self._by_entry.get((run.stream, run.entry_id)) is run:
            del self._by_entry[(run.stream, run.entry_id)]
        if self._by_cid.get(run.completion_id) is run:
            del self._by_cid[run.completion_id]

    def running(self) -> list[Running]:
        return list(self._by_entry.values())


    def __len__(self) -> int:
        return len(self._by_entry)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._by_entry

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._by_entry)

    def note_stage(self, completion_id: str, lifecycle: Lifecycle) -> None:
        run = self._by_cid.get(completion_id)
        if run is not None:
            run.stage = lifecycle

    def fence_out(self, run: Running) -> None:
        """Another orchestrator owns this request now: stop it, write nothing more."""
        if run.fenced:
            return
        run.fenced = True
        log.warning("request_lost_to_another_orchestrator", completion_id=run.completion_id, epoch=run.epoch)
        if run.task is not None and not run.task.done():
            run.task.cancel()

    def lose(self, run: Running) -> None:
        """Redis lost this request's state (its journal is gone with the data): end the
        run with a 503 now, rather than at its deadline; this process still finalizes it,
        since no other orchestrator knows of it."""
        if run.fenced or run.stop_error is not None:
            return
        run.stop_error = ServiceError(
            503, "request_state_lost",
            "Redis lost this request's state (it restarted without its data); the request was stopped",
        )
        log.warning("request_state_lost", completion_id=run.completion_id, epoch=run.epoch)
        if run.task is not None and not run.task.done():
            run.task.cancel()

    def stop_error(self, completion_id: str) -> HookbusError | None:
        """Why this process stopped the run of `completion_id` itself, if it did."""
        run = self._by_cid.get(completion_id)
        return None if run is None else run.stop_error

    def cancel(self, completion_id: str, reason: str = "cancelled by the client", *, stalled: bool = False) -> bool:
        """Cancel the run of `completion_id`; False when this process does not run it.
        `stalled`: its client stopped reading the stream (the gateway said so), which
        finalize and the terminal item say with the code `client_stalled`."""
        run = self._by_cid.get(completion_id)
        if run is None or run.fenced:
            return False
        if stalled and run.stop_error is None:
            run.stop_error = Cancelled("the client stopped reading the streamed answer", code="client_stalled")
        if run.cancel_reason is None:
            run.cancel_reason = reason
            log.info("request_cancel_received", completion_id=completion_id)
        if run.task is not None and not run.task.done():
            run.task.cancel()
        return True
