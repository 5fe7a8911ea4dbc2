"""The summary table: one row per step, with its time and what it showed."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel

from tests.deploy.check.commands import CheckFailed


class Row(BaseModel):
    step: str
    result: Literal["ok", "FAIL", "not run"]
    seconds: float
    detail: str


class Report:
    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.failed = False

    def step(self, name: str, action: Callable[[], str], *, always: bool = False) -> None:
        """Run one step unless an earlier one failed (or `always`); it returns the row's detail.
        Whatever a step raises fails that step: the steps after it are not run, but tear down
        and the table always are (an exception other than CheckFailed used to end the run
        with a traceback and no table, leaving `make` to say only that it exited 2)."""
        if self.failed and not always:
            self.rows.append(Row(step=name, result="not run", seconds=0.0, detail=""))
            return
        print(f"... {name}", flush=True)
        started = time.monotonic()
        try:
            detail, result = action(), "ok"
        except (CheckFailed, AssertionError) as exc:
            detail, result = f"{type(exc).__name__}: {exc}", "FAIL"
            self.failed = True
        except Exception as exc:  # noqa: BLE001 - a step that broke is a failed step, never a run without its table
            traceback.print_exc()
            detail, result = f"{type(exc).__name__} (traceback above): {exc}", "FAIL"
            self.failed = True
        seconds = round(time.monotonic() - started, 1)
        self.rows.append(Row(step=name, result=result, seconds=seconds, detail=detail))  # type: ignore[arg-type]
        print(f"    {result} in {seconds} s: {detail}", flush=True)

    def table(self) -> str:
        width = max(len(row.step) for row in self.rows)
        lines = [f"| {'step':<{width}} | result  | seconds | detail", f"|{'-' * (width + 2)}|---------|---------|-------"]
        for row in self.rows:
            detail = " ".join(row.detail.split())
            lines.append(f"| {row.step:<{width}} | {row.result:<7} | {row.seconds:>7.1f} | {detail}")
        total = sum(row.seconds for row in self.rows)
        lines.append(f"| {'total':<{width}} | {'FAIL' if self.failed else 'ok':<7} | {total:>7.1f} |")
        return "\n".join(lines)
