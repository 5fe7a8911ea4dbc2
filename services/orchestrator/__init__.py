"""The orchestrator: the agent loop, its LLM adapter, compaction and recovery."""

from services.orchestrator.agent import Agent

__all__ = ["Agent"]
