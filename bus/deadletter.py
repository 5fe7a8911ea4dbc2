"""The dead-letter stream: entries that could not be decoded or failed too many deliveries.

Each dead letter keeps the original fields, where it came from and why, so an operator
can inspect or replay it; the consumer that moved it acks the original and goes on.
"""

from __future__ import annotations

import time

import redis.asyncio as aredis
from redis.asyncio.client import Pipeline

DEAD_LETTER_MAXLEN = 100_000
MAX_FIELD_BYTES = 64 * 1024
"""Original fields are kept up to this size each (an oversized request is not copied whole)."""


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
    """Queue the dead-letter XADD on `pipe` (the caller acks in the same pipeline)."""
    record: dict[bytes | str, bytes | str] = {
        "source": source,
        "entry_id": entry_id,
        "reason": reason[:2000],
        "consumer": consumer,
        "ts": str(time.time()),
    }
    for key, value in fields.items():
        if len(value) > MAX_FIELD_BYTES:
            record[b"truncated:" + key] = str(len(value))
            value = value[:MAX_FIELD_BYTES]
        record[b"orig:" + key] = value
    pipe.xadd(dead_letter_stream, record, maxlen=DEAD_LETTER_MAXLEN, approximate=True)  # type: ignore[arg-type]




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
