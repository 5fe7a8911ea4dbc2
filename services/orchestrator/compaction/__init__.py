"""Compaction: keeping a conversation inside the model's context window.

`rules` holds the rules (pure functions of messages and a policy: what is cleared,
summarized, dropped); `compactor` binds them to one agent's model, LLM and skills;
`user_quotes` quotes the user's own words under a summary; `tokens` counts tokens and
knows each model's window; `token_scale` learns how a model's tokenizer compares.

Exposes `CompactionPolicy` (what an agent is given) and `Compactor` (what it runs).
"""

from hookbus.services.orchestrator.compaction.compactor import Compactor
from hookbus.services.orchestrator.compaction.rules import CompactionPolicy

__all__ = ["CompactionPolicy", "Compactor"]
