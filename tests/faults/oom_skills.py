"""The agent of the out-of-memory test (`tests.faults.oom_skills:agent`): its one skill
records every finalize_connection on disk, in the file `HOOKBUS_TEST_LEDGER` names,
because Redis refuses the fault ledger's own writes while the test holds it at maxmemory."""

from __future__ import annotations

import json
import os

from hookbus import Agent
from hookbus.skills import Context, HookData, Skill, hook
from tests.faults.fault_skills import NAME


class DiskLedger(Skill):
    """One JSON line per finalize_connection: completion id, who ran it, its error."""

    name = "disk-ledger"

    @hook("finalize_connection", 90)
    def record(self, data: HookData, ctx: Context) -> HookData:
        record = {
            "completion_id": ctx.completion_id,
            "by": NAME,
            "recovery": ctx.recovery,
            "error": data.error.status_code if data.error else None,
            "code": data.error.code if data.error else None,
        }
        with open(os.environ["HOOKBUS_TEST_LEDGER"], "a", encoding="utf-8") as ledger:
            ledger.write(json.dumps(record) + "\n")
        return data


def agent() -> Agent:
    return Agent("oom", skills=[DiskLedger()])
