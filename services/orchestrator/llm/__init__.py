"""The LLM adapter: the official `openai` async client against any compatible endpoint.

`client` holds the client class `LLM` (what every endpoint is sent, the narrow retry, and
why the orchestrator service picks aiohttp) and `require_endpoint`; `wire` one call as it
goes over HTTP (arguments, body, streamed chunks); `answers` what an answer must be before
it is passed on (`EmptyAnswer`, the unreadable answer) and its usage; `endpoint` what an
endpoint says of a model (window, tokenizer); `errors` the endpoint's errors as the client
sees them (`llm_error`, `timed_out`).

Exposes `LLM`, `HttpStack`, `EmptyAnswer`, `NoEndpoint` and `require_endpoint`.
"""

from hookbus.services.orchestrator.llm.answers import EmptyAnswer
from hookbus.services.orchestrator.llm.client import LLM, HttpStack, NoEndpoint, require_endpoint

__all__ = ["LLM", "EmptyAnswer", "HttpStack", "NoEndpoint", "require_endpoint"]
