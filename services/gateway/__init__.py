"""The OpenAI-compatible HTTP gateway: `POST /v1/chat/completions` and friends onto the queue.

    from hookbus.services.gateway import create_app, serve

`create_app(client, api_keys=..., models=..., limits=...)` builds the Starlette
app around a HookbusClient; `serve(host, port, api_keys_file, redis_url, prefix)` runs
it under uvicorn until SIGTERM. The gateway runs no agent code; run as many as you like.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hookbus.skills.lazy_names import lazy_names

if TYPE_CHECKING:
    from hookbus.services.gateway.app import create_app
    from hookbus.services.gateway.openapi import openapi_document
    from hookbus.services.gateway.server import serve

# Imported on first use: the command line and the offline model import the light modules of
# this package (edge_options, openai_wire) and must not pay for Starlette and the app.
_HOME = {
    "create_app": "hookbus.services.gateway.app",
    "openapi_document": "hookbus.services.gateway.openapi",
    "serve": "hookbus.services.gateway.server",
}

__all__ = ["create_app", "openapi_document", "serve"]


__getattr__, __dir__ = lazy_names(__name__, _HOME)
