"""Whose failure a case of `make check-real-model` is: hookbus's or the model's.

A case failed through hookbus is the model's only when every direct outcome that decides
it failed too. For each request of the call hookbus failed on those are the server's own
answer to it, as the recording hop kept it (an answer that passes, lost by hookbus, is
hookbus's failure), and the same bytes replayed straight to the server
(tests/real_model/replay.py), which fails when any replay fails (a sampled request: the
model answers it so). Where the check's own twin asks what the model must be able to
answer (the short form of a conversation hookbus compacted), that twin decides too. A twin
that is another request than hookbus's (the bare question, without the demo agent's
instructions and tools) is shown beside them but decides nothing. A failure with no direct
outcome to decide it, hookbus having asked the model nothing, is hookbus's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Said:
    """One side's outcome of a case: whether it passed, and what came back."""

    ok: bool
    what: str
    seconds: float = 0.0


@dataclass(frozen=True)
class Direct:
    """One request straight to the server, and whether it decides whose a failure is."""

    label: str
    said: Said
    decides: bool


def verdict(through: bool, directs: Sequence[Direct]) -> str:
    """PASS when hookbus passed; MODEL when it failed and every deciding direct request
    (at least one) failed too; FAIL, hookbus's failure, otherwise."""
    if through:
        return "PASS"
    deciding = [direct.said.ok for direct in directs if direct.decides]
    return "MODEL" if deciding and not any(deciding) else "FAIL"


def case_line(case: str, through: Said, directs: Sequence[Direct]) -> str:
    """The check's line for one case: its verdict, hookbus's side, then each direct request."""
    text = f"{verdict(through.ok, directs)} {case}: through hookbus {through.what} ({through.seconds:.1f} s)"
    for direct in directs:
        text += f" | {direct.label} {direct.said.what} ({direct.said.seconds:.1f} s)"
    return text
