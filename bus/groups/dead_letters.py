"""The dead-letter stream: entries that could not be decoded or failed too many deliveries.

A dead letter says where the entry came from, why it was set aside, who set it aside and
when, and describes the original without keeping it: each field's size and SHA-256, and
of an envelope only its routing fields (kind, version, completion id, hop id, lifecycle,
...). Message content, auth, session and state never reach the dead-letter stream: a
request the orchestrator could not read still holds the caller's prompt and credentials.
The digest lets an operator match a dead letter to a copy kept elsewhere (a client log).

Retention is bounded in entries, bytes and time: at most DEAD_LETTER_MAXLEN entries of
at most about ENTRY_BYTES each, none older than DEAD_LETTER_RETENTION seconds (trimmed
at each new dead letter), and the whole stream expires that long after the last one.
The consumer that moved an entry acks the original and goes on.

So that an operator can requeue it (the console does), the original's fields are kept
beside the stream, under `original_key(...)`, for ORIGINAL_RETENTION seconds and only up to
ORIGINAL_BYTES: the one place a dead letter's content lives, and it expires on its own.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any

import redis.asyncio as aredis
from redis.asyncio.client import Pipeline

DEAD_LETTER_MAXLEN = 10_000
DEAD_LETTER_RETENTION = 7 * 24 * 3600
REASON_CHARS = 1000
ROUTING_TEXT = ("kind", "completion_id", "hop_id", "lifecycle", "stage_key", "replica")
ROUTING_NUMBERS = ("v", "epoch", "deadline", "created")
"""Envelope fields a dead letter keeps: they say what the entry was, never what it held
(a number field holding anything but a number is dropped)."""
ROUTING_CHARS = 200
PARSE_AT_MOST = 256 * 1024
"""Larger originals are described by size and digest only (not parsed for routing fields)."""
ENTRY_BYTES = 4 * 1024
"""About the most one dead letter holds: reason, routing fields and one line per field."""
ORIGINAL_RETENTION = 24 * 3600
ORIGINAL_BYTES = 1024 * 1024
"""A larger original is not kept (its dead letter cannot be requeued)."""


def original_key(dead_letter_stream: str, source: str, entry_id: str) -> str:
    """The hash holding the fields of the entry that `source` set aside as `entry_id`."""
    return f"{dead_letter_stream}:original:{source}:{entry_id}"


_INPUT_VALUE = re.compile(r"input_value=.*?, input_type=")
"""Pydantic quotes the offending input in its errors: a reason keeps only its type."""


def describe(fields: dict[bytes, bytes]) -> str:
    """The original entry as JSON without its content: per field its size and digest,
    and the routing fields of the envelope (`e`) when it is readable JSON."""
    described: dict[str, Any] = {}
    for key, value in list(fields.items())[:16]:
        name = key.decode(errors="replace")[:64]
        described[name] = {"bytes": len(value), "sha256": hashlib.sha256(value).hexdigest()}
    routing = _routing(fields.get(b"e"))
    return json.dumps({"fields": described, "routing": routing}, separators=(",", ":"))


def _routing(raw: bytes | None) -> dict[str, Any]:
    if raw is None or len(raw) > PARSE_AT_MOST:
        return {}
    try:
        envelope = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):  # not JSON, or nested too deep to parse
        return {}
    if not isinstance(envelope, dict):
        return {}
    kept: dict[str, Any] = {}
    for name in ROUTING_TEXT:
        if isinstance(envelope.get(name), str):
            kept[name] = envelope[name][:ROUTING_CHARS]
    for name in ROUTING_NUMBERS:
        if isinstance(envelope.get(name), int | float) and not isinstance(envelope[name], bool):
            kept[name] = envelope[name]
    return kept


def add_dead_letter(
    pipe: Pipeline | aredis.Redis,
    dead_letter_stream: str,
    *,
    source: str,
    entry_id: str,
    reason: str,
    fields: dict[bytes, bytes],
    consumer: str,
) -> None:
    """Queue the dead-letter XADD and its trims on `pipe` (the caller acks in the same
    pipeline)."""
    now = time.time()
    record: dict[str, str] = {
        "source": source[:ROUTING_CHARS],
        "entry_id": entry_id[:ROUTING_CHARS],
        "reason": _INPUT_VALUE.sub("input_type=", reason[: 4 * REASON_CHARS])[:REASON_CHARS],
        "consumer": consumer[:ROUTING_CHARS],
        "ts": str(now),
        "original": describe(fields),
    }
    pipe.xadd(dead_letter_stream, record, maxlen=DEAD_LETTER_MAXLEN, approximate=True)  # type: ignore[arg-type]
    pipe.xtrim(dead_letter_stream, minid=f"{int((now - DEAD_LETTER_RETENTION) * 1000)}-0", approximate=False)
    pipe.expire(dead_letter_stream, DEAD_LETTER_RETENTION)
    if fields and sum(len(k) + len(v) for k, v in fields.items()) <= ORIGINAL_BYTES:
        kept = original_key(dead_letter_stream, record["source"], record["entry_id"])
        pipe.hset(kept, mapping=fields)  # type: ignore[arg-type]
        pipe.expire(kept, ORIGINAL_RETENTION)


async def send_dead_letter(
    client: aredis.Redis,
    dead_letter_stream: str,
    *,
    source: str,
    entry_id: str,
    reason: str,
    fields: dict[bytes, bytes],
    consumer: str,
) -> None:
    """One dead letter on its own (for streams without a consumer group: nothing to ack)."""
    async with client.pipeline(transaction=False) as pipe:
        add_dead_letter(
            pipe, dead_letter_stream, source=source, entry_id=entry_id, reason=reason,
            fields=fields, consumer=consumer,
        )
        await pipe.execute()
