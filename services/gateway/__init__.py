"""The OpenAI-compatible HTTP gateway: `POST /v1/chat/completions` and friends onto the queue.

    from hookbus.services.gateway import create_app, serve

`create_app(client, api_keys=..., models=..., limits=...)` builds the Starlette
app around a HookbusClient; `serve(host, port, api_keys_file, redis_url, prefix)` runs
it under uvicorn until SIGTERM. The gateway runs no agent code; run as many as you like.
"""

from hookbus.services.gateway.app import create_app
from hookbus.services.gateway.openapi import openapi_document
from hookbus.services.gateway.server import serve

__all__ = ["create_app", "openapi_document", "serve"]
