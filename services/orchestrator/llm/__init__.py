"""The LLM adapter: the official `openai` async client against any compatible endpoint.

`client` holds the client class `LLM` (what every endpoint is sent, the narrow retry, and
why the orchestrator service picks aiohttp), the answer checks and the error mapping.

Exposes `LLM`, `HttpStack`, `EmptyAnswer`, `NoEndpoint` and `require_endpoint`.
"""

from hookbus.services.orchestrator.llm.client import (
    LLM,
    EmptyAnswer,
    HttpStack,
    NoEndpoint,
    require_endpoint,
)

__all__ = ["LLM", "EmptyAnswer", "HttpStack", "NoEndpoint", "require_endpoint"]
