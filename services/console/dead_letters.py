"""Dead letters for an operator: list, inspect, requeue, delete.

A dead letter describes its original without holding it (hookbus.bus.groups.dead_letters);
the original's fields are kept beside it for a while (`original_key`), which is what
inspecting shows and requeueing sends back to the stream it came from. Inspecting hides
message content unless asked: every text value but the routing ones (ids, kinds, roles,
names) is replaced by its length, the way traces leave content out by default.
"""

from __future__ import annotations

import json
import re
from typing import Any

import redis.asyncio as aredis
from pydantic import BaseModel, Field

from hookbus.bus.connection.cluster import in_order
from hookbus.bus.connection.values import text
from hookbus.bus.groups.dead_letters import original_key
from hookbus.bus.keys import Keys

LISTED = 100
"""The newest dead letters the console lists."""
SHOWN_TEXT = frozenset({
    "v", "kind", "completion_id", "hop_id", "lifecycle", "stage_key", "replica", "reply_to", "group",
    "role", "name", "type", "id", "tool_call_id", "model", "skill", "method", "session_id", "reason",
})
"""Text values inspect shows without being asked for content: they route, they do not say."""
MAX_DEPTH = 100
"""A field nested deeper than this is shown as its raw text, not parsed: parsing, hiding and
answering it would each recurse once per level (a RecursionError, not a page)."""


ENTRY_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
"""A stream entry id as Redis writes it (anything else would be a Redis error, not a 404)."""


class DeadLetterView(BaseModel):
    id: str
    source: str
    entry_id: str
    reason: str
    consumer: str
    ts: float
    routing: dict[str, Any] = Field(default_factory=dict)


class DeadLetterDetail(BaseModel):
    letter: DeadLetterView
    original: dict[str, Any] | None = Field(
        description="The original entry's fields (JSON ones parsed); None once it expired or was too large to keep."
    )
    content_shown: bool


class Requeued(BaseModel):
    stream: str
    entry_id: str


async def list_dead_letters(client: aredis.Redis, keys: Keys, count: int = LISTED) -> list[DeadLetterView]:
    """The newest `count` dead letters, newest first."""
    entries: Any = await client.xrevrange(keys.dead_letter, count=count)
    return [_view(entry_id, fields) for entry_id, fields in entries]


async def dead_letter(client: aredis.Redis, keys: Keys, letter_id: str) -> DeadLetterView | None:
    """The dead letter `letter_id`; None when there is none (or the id is no stream id)."""
    if not ENTRY_ID.fullmatch(letter_id):
        return None
    entries: Any = await client.xrange(keys.dead_letter, min=letter_id, max=letter_id)
    return _view(*entries[0]) if entries else None


async def inspect(client: aredis.Redis, keys: Keys, letter: DeadLetterView, *, content: bool) -> DeadLetterDetail:
    fields: Any = await client.hgetall(original_key(keys.dead_letter, letter.source, letter.entry_id))
    original = {text(k): _parsed(v, content) for k, v in fields.items()} if fields else None
    return DeadLetterDetail(letter=letter, original=original, content_shown=content)


async def requeue(client: aredis.Redis, keys: Keys, letter: DeadLetterView) -> Requeued | None:
    """Send the original back onto its stream and drop the dead letter; None when the
    original is no longer kept (the dead letter stays)."""
    kept = original_key(keys.dead_letter, letter.source, letter.entry_id)
    fields = await client.hgetall(kept)
    if not fields:
        return None

    def send_back(pipe: Any) -> None:
        pipe.xadd(letter.source, fields)

    def forget(pipe: Any) -> None:
        pipe.xdel(keys.dead_letter, letter.id)
        pipe.delete(kept)

    new_id, *_ = await in_order(client, send_back, forget)
    return Requeued(stream=letter.source, entry_id=text(new_id))


async def delete(client: aredis.Redis, keys: Keys, letter: DeadLetterView) -> None:
    async with client.pipeline(transaction=False) as pipe:
        pipe.xdel(keys.dead_letter, letter.id)
        pipe.delete(original_key(keys.dead_letter, letter.source, letter.entry_id))
        await pipe.execute()


def _view(entry_id: Any, fields: dict[bytes, bytes]) -> DeadLetterView:
    values = {text(k): text(v) for k, v in fields.items()}
    try:
        routing = json.loads(values.get("original", "{}")).get("routing", {})
    except (ValueError, AttributeError, RecursionError):
        routing = {}
    try:
        ts = float(values.get("ts", 0))
    except ValueError:
        ts = 0.0
    return DeadLetterView(
        id=text(entry_id), source=values.get("source", ""), entry_id=values.get("entry_id", ""),
        reason=values.get("reason", ""), consumer=values.get("consumer", ""), ts=ts,
        routing=routing if isinstance(routing, dict) else {},
    )


def _parsed(raw: bytes, content: bool) -> Any:
    """A field as JSON when it is JSON nested at most MAX_DEPTH deep (else its raw text),
    its content hidden unless asked."""
    try:
        value: Any = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        value = raw
    if isinstance(value, bytes) or _deeper_than(value, MAX_DEPTH):
        shown = raw.decode(errors="replace")
        return shown if content else _hidden(shown)
    return value if content else _without_content(value)


def _deeper_than(value: Any, depth: int) -> bool:
    """Whether `value` nests lists and objects more than `depth` deep (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if level > depth:
            return True
        stack.extend((child, level + 1) for child in children)
    return False


def _without_content(value: Any, key: str | None = None) -> Any:
    if isinstance(value, dict):
        return {k: _without_content(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_content(v, key) for v in value]
    if isinstance(value, str) and key not in SHOWN_TEXT:
        return _hidden(value)
    return value


def _hidden(value: str) -> str:
    return f"[hidden: {len(value)} characters]"
