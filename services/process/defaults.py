"""Defaults of the orchestrator and worker services, each written once: the services'
constructors and the command line read them from here (request limits: hookbus.bus.limits)."""

from __future__ import annotations

ORCHESTRATOR_CONCURRENCY = 64
"""Requests one orchestrator runs at once."""
ORCHESTRATOR_CLAIM_IDLE = 10.0
"""Seconds of silence (no heartbeat) before a dead orchestrator's requests are claimed."""
ORCHESTRATOR_MAX_DELIVERIES = 5
"""Deliveries of one request before it is set aside (it keeps killing orchestrators)."""

WORKER_CONCURRENCY = 16
"""Hops one worker replica runs (and prefetches) at once."""
WORKER_CLAIM_IDLE = 5.0
"""Seconds of silence before a dead sibling replica's hops are claimed."""
WORKER_MAX_DELIVERIES = 3
"""Deliveries of one hop before it is dead-lettered and counts as its hooks failing."""
