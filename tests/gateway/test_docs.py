"""The generated documents: AsyncAPI of the bus (from the FastStream apps), OpenAPI of the gateway."""

from __future__ import annotations

import json

import jsonschema
from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR

from hookbus.bus.wire.envelopes import HopEvent, RequestEnvelope
from hookbus.services.protocol.asyncapi import asyncapi_document, openapi_document


def test_the_asyncapi_document_describes_every_stream_with_its_envelope():
    document = asyncapi_document()
    json.dumps(document)  # plain JSON
    assert document["asyncapi"].startswith("3.")
    channels = document["channels"]
    addresses = {name: channel["address"] for name, channel in channels.items()}
    assert addresses == {
        "requests": "hookbus:requests",
        "hooks:{group}": "hookbus:hooks:{group}",
        "responses": "hookbus:responses:{completion_id}",
        "replies": "hookbus:replies:{instance}",
        "events": "hookbus:events",
        "dead-letter": "hookbus:dead-letter",
    }
    assert channels["requests"]["bindings"]["redis"]["groupName"] == "orchestrators"
    assert channels["hooks:{group}"]["bindings"]["redis"]["groupName"] == "{group}"

    messages = document["components"]["messages"]
    schemas = document["components"]["schemas"]

    def payload(channel: str) -> dict:
        (ref,) = channels[channel]["messages"].values()
        message = messages[ref["$ref"].rsplit("/", 1)[-1].replace("%7B", "{").replace("%7D", "}")]
        return schemas[message["payload"]["$ref"].rsplit("/", 1)[-1]]

    assert set(payload("requests")["properties"]) == set(RequestEnvelope.model_fields)
    assert set(payload("hooks:{group}")["properties"]) == set(HopEvent.model_fields)
    assert payload("responses")["title"] == "ResponseBatch"
    assert "ResponseItem" in schemas
    assert payload("replies")["title"] == "HopReply"
    assert payload("events")["title"] == "MonitorBatch"
    assert "MonitorRecord" in schemas
    assert "reason" in payload("dead-letter")["properties"]
    assert "EmptyPayload" not in schemas
    # every $ref resolves inside the document
    text = json.dumps(document)
    for ref in {part.split('"')[0] for part in text.split('"$ref": "')[1:]}:
        node = document
        for step in ref.removeprefix("#/").split("/"):
            node = node[step.replace("%7B", "{").replace("%7D", "}")]


def test_the_asyncapi_document_follows_the_prefix():
    document = asyncapi_document("{acme}:", group="billing")
    assert document["channels"]["requests"]["address"] == "{acme}:requests"
    assert document["channels"]["hooks:billing"]["address"] == "{acme}:hooks:billing"


def test_the_openapi_document_is_valid_openapi_3_1():
    for document in (openapi_document(), openapi_document(["offline", "offline-small"])):
        errors = list(OPENAPI_31_VALIDATOR.iter_errors(document))
        assert not errors, errors[:3]
        for name, schema in document["components"]["schemas"].items():
            jsonschema.Draft202012Validator.check_schema(schema), name
    enum = openapi_document(["a", "b"])["components"]["schemas"]["ChatCompletionRequest"]["properties"]["model"]
    assert enum["enum"] == ["a", "b"]
    paths = openapi_document()["paths"]
    assert set(paths) == {
        "/v1/chat/completions", "/v1/responses", "/v1/responses/{response_id}", "/v1/models",
        "/v1/models/{model}", "/healthz", "/metrics",
    }
    for create in (paths["/v1/chat/completions"]["post"], paths["/v1/responses"]["post"]):
        assert {"200", "400", "401", "402", "404", "413"} <= set(create["responses"])
    assert set(paths["/v1/responses/{response_id}"]) == {"get", "delete"}
