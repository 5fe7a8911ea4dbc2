"""The orchestrator: the agent loop, its LLM adapter, compaction and recovery.

    loop/        the agent loop: `Agent`, one request through its lifecycle points, the
                 hook plan, the runtime interface, client tools, observers' hand-off
    streaming/   a streamed call's chunks: on_chunk batching, the hold-back window, the
                 completion assembled from chunks, the turn the client sees
    compaction/  keeping a conversation inside the context window: the rules, the
                 agent's compactor, token counting
    llm/         the LLM adapter: the client, answer checks, endpoint facts, error mapping
    serving/     the orchestrator service over Redis: reading, admitting and running
                 requests, the bus runtime, version pins, recovery
    demo.py      the demo agent of `make run` and the deploy files

Exports `Agent`, `CompactionPolicy` and `Compaction`.
"""

from hookbus.services.orchestrator.compaction.rules import CompactionPolicy
from hookbus.services.orchestrator.loop.agent import Agent
from hookbus.skills.compaction_outcome import Compaction

__all__ = ["Agent", "Compaction", "CompactionPolicy"]
