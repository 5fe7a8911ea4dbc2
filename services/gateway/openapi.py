"""The gateway's OpenAPI 3.1 document, built from the same pydantic models it validates with.

`GET /openapi.json` on a running gateway serves it with that gateway's model names (as an
enum) and its auth; `hookbus docs openapi` prints the generic one.
"""

from __future__ import annotations

import copy
from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic.json_schema import models_json_schema

from hookbus.services.gateway.models import (
    SESSION_ID_MAX,
    ChatCompletionRequest,
    ErrorBody,
    Health,
    ModelCard,
    ModelList,
)
from hookbus.services.gateway.responses_models import (
    ArgumentsDeltaEvent,
    ArgumentsDoneEvent,
    ContentPartEvent,
    DeletedResponse,
    ErrorEvent,
    OutputItemEvent,
    ResponseLifecycleEvent,
    ResponseObject,
    ResponsesRequest,
    TextDeltaEvent,
    TextDoneEvent,
)

REF = "#/components/schemas/{model}"
RESPONSE_EVENTS = (
    ResponseLifecycleEvent, OutputItemEvent, ContentPartEvent, TextDeltaEvent, TextDoneEvent,
    ArgumentsDeltaEvent, ArgumentsDoneEvent, ErrorEvent,
)


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
    }


def _json(ref: str, description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}},
    }


def _as_the_server_checks(components: dict[str, Any]) -> None:
    """What the request models let through but the server refuses, said in the schemas:
    a tool message answers a tool call (it has a `tool_call_id`, and it is never the first
    message); a Responses request has something to answer (an `input` that is not null or
    empty, a `previous_response_id` or `instructions`)."""
    tool_message = {"properties": {"role": {"const": "tool"}}, "required": ["role"]}
    components["Message"]["if"] = tool_message
    components["Message"]["then"] = {"required": ["tool_call_id"]}
    messages = components["ChatCompletionRequest"]["properties"]["messages"]
    messages["prefixItems"] = [{"$ref": messages["items"]["$ref"], "not": tool_message}]
    request = components["ResponsesRequest"]
    given = request["properties"]["input"]
    given["anyOf"] = [
        {**kind, "minItems": 1} if kind.get("type") == "array" else kind
        for kind in given["anyOf"] if kind.get("type") != "null"
    ]
    given.pop("default", None)
    request["anyOf"] = [{"required": [name]} for name in ("input", "previous_response_id", "instructions")]


def openapi_document(
    models: list[str] | None = None, *, auth: bool = True, version: str = "0.1.0"
) -> dict[str, Any]:
    """The OpenAPI document; `models` (if given) become the enum of the request's `model`."""
    _, schemas = models_json_schema(
        [
            (ChatCompletionRequest, "validation"),
            (ErrorBody, "serialization"),
            (ModelList, "serialization"),
            (ModelCard, "serialization"),
            (Health, "serialization"),
            (ChatCompletion, "serialization"),
            (ChatCompletionChunk, "serialization"),
            (ResponsesRequest, "validation"),
            (ResponseObject, "serialization"),
            (DeletedResponse, "serialization"),
            *((event, "serialization") for event in RESPONSE_EVENTS),
        ],
        ref_template=REF,
    )
    components: dict[str, Any] = copy.deepcopy(schemas.get("$defs", {}))
    _as_the_server_checks(components)
    if models:
        for name in ("ChatCompletionRequest", "ResponsesRequest"):
            request_schema = components[name]
            request_schema["properties"]["model"] = {
                **request_schema["properties"]["model"], "enum": list(models),
            }
    security: list[dict[str, list[str]]] = [{"bearerAuth": []}] if auth else []
    unauthorized = {"401": _error("Missing or unknown API key.")} if auth else {}
    at_the_edge = {
        "408": _error("The body did not arrive within the gateway's --body-timeout."),
        **(
            {"429": _error("The key is at its max_parallel_requests or rpm_limit; see Retry-After.")}
            if auth else {
                "403": _error("Auth is off and the Host is not a loopback or --allowed-hosts name."),
                "415": _error("Auth is off and the body is not Content-Type: application/json."),
            }
        ),
    }
    session_header = {
        "name": "X-Session-Id",
        "in": "header",
        "required": False,
        "description": "Session id for ctx.session (wins over the body's `user`).",
        "schema": {"type": "string", "minLength": 1, "maxLength": SESSION_ID_MAX, "pattern": r"^\S(.*\S)?$"},
    }
    chat_ok = {
        "description": (
            "Not streamed: the completion. Streamed: Server-Sent Events, one "
            "`data: {ChatCompletionChunk}` per chunk, `data: {\"error\": {...}}` if the run "
            "failed after the first chunk, and `data: [DONE]` last."
        ),
        "headers": {
            "X-Hookbus-Completion-Id": {
                "description": "The completion id (also the `id` of the completion and of every chunk).",
                "schema": {"type": "string"},
            }
        },
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/ChatCompletion"}},
            "text/event-stream": {
                # Open API 3.1 convention for event streams: `schema` describes one event.
                "schema": {
                    "type": "object",
                    "properties": {
                        "event": {"type": "string"},
                        "data": {
                            "type": "string",
                            "description": (
                                "A ChatCompletionChunk as JSON, an error body as JSON "
                                "(`{\"error\": {...}}`, then the stream ends), or `[DONE]`."
                            ),
                        },
                    },
                    "required": ["data"],
                },
                "x-data-schemas": [
                    {"$ref": "#/components/schemas/ChatCompletionChunk"},
                    {"$ref": "#/components/schemas/ErrorBody"},
                ],
            },
        },
    }
    response_id = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}
    response_ok = {
        "description": (
            "Not streamed: the response. Streamed: Server-Sent Events, each `event: {type}` "
            "with `data: {the event}`: `response.created`, `response.in_progress`, output item, "
            "content part, text and function-call argument events, then `response.completed` "
            "(or `response.incomplete`); after a failure, `error` then `response.failed`."
        ),
        "headers": {
            "X-Hookbus-Completion-Id": {
                "description": "The response id (the run's completion id).",
                "schema": {"type": "string"},
            }
        },
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/ResponseObject"}},
            "text/event-stream": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "event": {"type": "string", "description": "The event's `type`."},
                        "data": {"type": "string", "description": "The event as JSON."},
                    },
                    "required": ["event", "data"],
                },
                "x-data-schemas": [
                    {"$ref": f"#/components/schemas/{event.__name__}"} for event in RESPONSE_EVENTS
                ],
            },
        },
    }
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "hookbus gateway",
            "version": version,
            "description": (
                "OpenAI-compatible Chat Completions and Responses API in front of the hookbus "
                "request queue. "
                "Every request runs through the agent's lifecycle hooks; any OpenAI client "
                "works unchanged (base URL `http://HOST:PORT/v1`)."
            ),
        },
        "paths": {
            "/v1/chat/completions": {
                "post": {
                    "operationId": "createChatCompletion",
                    "summary": "Run one request through the agent (streamed or not).",
                    "security": security,
                    "parameters": [session_header],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/ChatCompletionRequest"}
                            }
                        },
                    },
                    "responses": {
                        "200": chat_ok,
                        "400": _error("The body is not a valid request; the message says what is wrong."),
                        **unauthorized,
                        "402": _error("A payment hook refused the request."),
                        "404": _error("Unknown model (`model_not_found`)."),
                        "413": _error("The body, or one message, is larger than the gateway accepts."),
                        **at_the_edge,
                        "default": _error("Any other structured error a hook raised, with its status."),
                    },
                }
            },
            "/v1/responses": {
                "post": {
                    "operationId": "createResponse",
                    "summary": "Run one Responses API request through the agent (streamed or not).",
                    "security": security,
                    "parameters": [session_header],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/ResponsesRequest"}}
                        },
                    },
                    "responses": {
                        "200": response_ok,
                        "400": _error("The body is not a valid request; the message says what is wrong."),
                        **unauthorized,
                        "402": _error("A payment hook refused the request."),
                        "404": _error("Unknown model, or no such `previous_response_id` for this caller."),
                        "413": _error("The body, or one message, is larger than the gateway accepts."),
                        **at_the_edge,
                        "default": _error("Any other structured error a hook raised, with its status."),
                    },
                }
            },
            "/v1/responses/{response_id}": {
                "get": {
                    "operationId": "getResponse",
                    "summary": "A stored response of the caller.",
                    "security": security,
                    "parameters": [response_id],
                    "responses": {
                        "200": _json("ResponseObject", "The response."),
                        "404": _error("No such response for this caller (or it expired)."),
                        **unauthorized,
                    },
                },
                "delete": {
                    "operationId": "deleteResponse",
                    "summary": "Delete a stored response of the caller.",
                    "security": security,
                    "parameters": [response_id],
                    "responses": {
                        "200": _json("DeletedResponse", "Deleted."),
                        "404": _error("No such response for this caller (or it expired)."),
                        **unauthorized,
                    },
                },
            },
            "/v1/models": {
                "get": {
                    "operationId": "listModels",
                    "summary": "The model name(s) the agent answers as.",
                    "security": security,
                    "responses": {"200": _json("ModelList", "The models."), **unauthorized},
                }
            },
            "/v1/models/{model}": {
                "get": {
                    "operationId": "retrieveModel",
                    "security": security,
                    "parameters": [
                        {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
                    ],
                    "responses": {
                        "200": _json("ModelCard", "The model."),
                        "404": _error("Unknown model."),
                        **unauthorized,
                    },
                }
            },
            "/healthz": {
                "get": {
                    "operationId": "health",
                    "summary": "Redis answers and an orchestrator heartbeat is under 10 s old.",
                    "security": [],
                    "responses": {
                        "200": _json("Health", "Ready."),
                        "503": _json("Health", "Not ready; the body says why."),
                    },
                }
            },
            "/metrics": {
                "get": {
                    "operationId": "metrics",
                    "summary": "Prometheus metrics (text exposition format).",
                    "security": [],
                    "responses": {
                        "200": {
                            "description": "Metrics.",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
        },
        "components": {"schemas": components},
    }
    if auth:
        document["components"]["securitySchemes"] = {
            "bearerAuth": {"type": "http", "scheme": "bearer", "description": "An API key from the keys file."}
        }
        document["security"] = security
    return document
