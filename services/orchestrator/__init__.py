"""The orchestrator: the agent loop, its LLM adapter, compaction and recovery."""

from hookbus.services.orchestrator.agent import Agent
from hookbus.services.orchestrator.compaction import Compaction, CompactionPolicy

__all__ = ["Agent", "Compaction", "CompactionPolicy"]
