"""What an orchestrator does with a request it took from the queue: `OrchestratorService.execute`'s modes."""

from __future__ import annotations

import enum


class RunMode(enum.StrEnum):
    """How `OrchestratorService.execute` treats one request (the string is what spans and the
    request's monitor records show)."""

    RUN = "run"
    """Run it from the start."""
    CANCELLED = "cancelled"
    """Its client cancelled it before it ran: only finalize_connection runs, with a 499."""
    RESUME = "resume"
    """Claimed from a lost orchestrator that had started it: the run goes on from the last
    step its journal records (hookbus.services.orchestrator.loop.run_steps)."""
    RECOVER = "recover"
    """Claimed from a lost orchestrator that had started it, and cannot go on (a stream
    whose client got text already): only finalize_connection runs, with a 503
    `orchestrator_lost`."""
    END = "end"
    """Claimed from a lost orchestrator after its finalize_connection ran: only its end is stored."""

    @property
    def recovering(self) -> bool:
        """Claimed from a lost orchestrator: its trace starts anew, linked to the lost one."""
        return self in (RunMode.RESUME, RunMode.RECOVER, RunMode.END)

    @property
    def runs(self) -> bool:
        """The agent runs (from the start, or on from where a lost orchestrator left it)."""
        return self in (RunMode.RUN, RunMode.RESUME)
