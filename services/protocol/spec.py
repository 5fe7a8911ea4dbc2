"""The worker protocol as files: the AsyncAPI document and a JSON Schema per message, with the
protocol version and its revision table, generated from the pydantic models.

    hookbus protocol --out DIR    ->  write_spec(DIR)
    services/protocol/spec/       the committed copy (tests/unit/test_protocol_spec.py keeps
                                  it equal to what the models generate)

A worker in another language reads these: a hop (`HopEvent` in the entry field `e`, the
context `Context` in `c`, the stage data `HookData` in `d`, or for a batched on_chunk hop a
`ChunkBatch` in `d`), its reply (`HopReply` in `e`, changed data in `d`, a `ChunkResults`
array for a batch), the group's `GroupAnnouncement` in the registry hash and each replica's
`ReplicaHeartbeat`. `protocol.json` also states the constants every worker keeps to
(timings, size limits, the version rule, key names: hookbus.services.protocol.constants),
which the TypeScript package reads from the committed copy when it is built.
docs/protocol.md says how they fit together.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, TypeAdapter

from hookbus.bus.groups.registry import GroupAnnouncement, ReplicaHeartbeat
from hookbus.bus.wire.chunk_batch import CHUNK_BATCH, CHUNK_RESULTS
from hookbus.bus.wire.envelopes import HopEvent, HopReply
from hookbus.bus.wire.protocol_version import PROTOCOL, SERVED_MAJORS
from hookbus.services.protocol.asyncapi import DeadLetter, asyncapi_document
from hookbus.services.protocol.constants import protocol_constants
from hookbus.skills import Context, HookData

SPEC_DIR = Path(__file__).with_name("spec")


class Revision(BaseModel):
    """One line of the revision table."""

    version: str
    date: str
    changes: str


REVISIONS = [
    Revision(
        version="1.0",
        date="2026-12-04",
        changes=(
            "The first versioned specification of what workers have spoken since the split hop "
            "format (envelope v 2): hops, replies, batched on_chunk hops, announcements with "
            "`protocol`, heartbeat records. A worker that announces no `protocol` speaks 1.0."
        ),
    ),
    Revision(
        version="1.1",
        date="2026-12-07",
        changes=(
            "A batched on_chunk hop may name its stream (`HopEvent.text`): its chunks then come without "
            "the text so far and without a `content` that is the chunk's own text; the worker keeps each "
            "stream's text, extends it with `text.gap` (the chunks its replica may lack) and sets every "
            "chunk's `full_content` from it; results carry no `full_content`; a replica that lacks the "
            "text answers `needs_text` (`HopReply`) and gets the batch again with the whole text. An "
            "orchestrator names the stream only to a group whose announcement and live replicas all say "
            "1.1 or later, so 1.0 workers see nothing new."
        ),
    ),
]


class MessageFile(BaseModel):
    """Where one message travels and which schema file describes it."""

    schema_file: str = Field(alias="schema")
    where: str


MESSAGES: Mapping[str, tuple[Any, str]] = {
    "HopEvent": (HopEvent, "entry field `e` of a hop on the stream `hooks:{group}`"),
    "Context": (Context, "entry field `c` of a hook hop: the request's context"),
    "HookData": (HookData, "entry field `d` of a hook hop, and of its reply when the hooks changed the data"),
    "ChunkBatch": (CHUNK_BATCH, "entry field `d` of a batched on_chunk hop (`chunks` > 0)"),
    "ChunkResults": (CHUNK_RESULTS, "entry field `d` of the reply to a batched on_chunk hop"),
    "HopReply": (HopReply, "entry field `e` of a reply on the stream `reply_to` names"),
    "GroupAnnouncement": (GroupAnnouncement, "the group's field in the registry hash"),
    "ReplicaHeartbeat": (ReplicaHeartbeat, "one replica's heartbeat record (a string key that expires)"),
    "DeadLetter": (DeadLetter, "the fields of an entry on the dead-letter stream"),
}


def message_schema(name: str) -> dict[str, Any]:
    """The JSON Schema (2020-12) of one message, titled after it."""
    kind, where = MESSAGES[name]
    adapter = kind if isinstance(kind, TypeAdapter) else TypeAdapter(kind)
    schema: dict[str, Any] = adapter.json_schema()
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": f"{name}.json", **schema}
    schema["title"] = name
    schema.setdefault("description", where)
    return schema


def index() -> dict[str, Any]:
    """`protocol.json`: the version, what it serves, the revisions, the message files and the
    constants every worker shares."""
    return {
        "protocol": PROTOCOL,
        "served_majors": sorted(SERVED_MAJORS),
        "constants": protocol_constants().model_dump(),
        "revisions": [r.model_dump() for r in REVISIONS],
        "messages": {
            name: MessageFile(schema=f"schemas/{name}.json", where=where).model_dump(by_alias=True)
            for name, (_, where) in MESSAGES.items()
        },
        "asyncapi": "asyncapi.json",
    }


def spec_files() -> dict[str, str]:
    """Every file of the spec, by its path under the spec folder, as text."""
    files = {
        "protocol.json": index(),
        "asyncapi.json": asyncapi_document(),
        **{f"schemas/{name}.json": message_schema(name) for name in MESSAGES},
    }
    return {path: json.dumps(body, indent=2, sort_keys=True) + "\n" for path, body in files.items()}


def write_spec(out: Path) -> list[Path]:
    """Write the spec under `out` (replacing older files of the same names); the paths written."""
    written = []
    for relative, body in spec_files().items():
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
        written.append(path)
    return written
