"""The orchestrator: the agent loop, its LLM adapter, compaction and recovery."""

from hookbus.services.orchestrator.agent import Agent
from hookbus.services.orchestrator.compaction import CompactionPolicy
from hookbus.skills.compaction_outcome import Compaction

__all__ = ["Agent", "Compaction", "CompactionPolicy"]
