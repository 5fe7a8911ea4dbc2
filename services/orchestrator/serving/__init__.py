"""The orchestrator service: what takes requests off the `requests` queue and runs them on
the agent over Redis (the agent loop itself lives in the rest of hookbus.services.orchestrator).

    from hookbus.services.orchestrator.serving import OrchestratorService

`OrchestratorService(agent, redis_url, ...)` consumes `requests` in group `orchestrators`
and answers each on `responses:{completion_id}`; `BusRuntime` is the runtime it gives the
agent (hops to worker groups, each request on the versions `VersionPins` chose);
`Recovery` claims what a lost orchestrator left; `RunTable` holds the requests a process
runs (`Running`), and `RunMode` says what it does with each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hookbus.skills.lazy_names import lazy_names

if TYPE_CHECKING:
    from hookbus.services.orchestrator.serving.bus_runtime import BusRuntime
    from hookbus.services.orchestrator.serving.recovery import Recovery
    from hookbus.services.orchestrator.serving.run_mode import RunMode
    from hookbus.services.orchestrator.serving.run_table import Running, RunTable
    from hookbus.services.orchestrator.serving.service import OrchestratorService
    from hookbus.services.orchestrator.serving.version_pins import VersionPins

# Imported on first use: a module that needs one light name (the tracing module's RunMode,
# a test's VersionPins) must not load the service and its broker with it.
_HOME = {
    "BusRuntime": "hookbus.services.orchestrator.serving.bus_runtime",
    "OrchestratorService": "hookbus.services.orchestrator.serving.service",
    "Recovery": "hookbus.services.orchestrator.serving.recovery",
    "RunMode": "hookbus.services.orchestrator.serving.run_mode",
    "RunTable": "hookbus.services.orchestrator.serving.run_table",
    "Running": "hookbus.services.orchestrator.serving.run_table",
    "VersionPins": "hookbus.services.orchestrator.serving.version_pins",
}

__all__ = ["BusRuntime", "OrchestratorService", "Recovery", "RunMode", "RunTable", "Running", "VersionPins"]


__getattr__, __dir__ = lazy_names(__name__, _HOME)
