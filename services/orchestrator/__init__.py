"""The orchestrator: the agent loop, its LLM adapter, compaction and recovery."""

from services.orchestrator.agent import Agent
from services.orchestrator.compaction import Compaction, CompactionPolicy

__all__ = ["Agent", "Compaction", "CompactionPolicy"]
