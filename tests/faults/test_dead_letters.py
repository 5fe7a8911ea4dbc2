"""Dead letters keep no message content or auth, and their retention is bounded; the
original kept beside them for requeueing expires and has a size bound.

The attack: a request that the orchestrator cannot decode, carrying a prompt and the
caller's principal (written to the queue directly, as any client of the bus can), used
to leave a permanent dead letter holding both.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid

from hookbus import Agent
from hookbus.bus.connection.retrying import connect
from hookbus.bus.groups.dead_letters import (
    DEAD_LETTER_MAXLEN,
    DEAD_LETTER_RETENTION,
    ORIGINAL_BYTES,
    ORIGINAL_RETENTION,
    describe,
    original_key,
    send_dead_letter,
)
from hookbus.bus.keys import Keys
from tests.faults.helpers import read_until_terminal
from tests.integration.stack import running_stack

SECRET_PROMPT = "my bank password is hunter2"
SECRET_PRINCIPAL = "alice-the-principal"


async def test_an_unreadable_request_leaves_a_dead_letter_without_its_content(redis_url, prefix) -> None:
    cid = f"chatcmpl-{uuid.uuid4().hex}"
    envelope = {
        "v": 1, "kind": "request", "completion_id": cid,
        "messages": [{"role": "user", "content": SECRET_PROMPT}],
        "auth": {"peer_user_id": SECRET_PRINCIPAL, "scopes": ["admin"]},
        "deadline": "soon",  # what makes it unreadable
    }
    raw = json.dumps(envelope).encode()
    async with running_stack(redis_url, prefix, Agent("t")) as (client, _, _):
        redis, keys = client.redis, client.keys
        old_id = f"{int((time.time() - DEAD_LETTER_RETENTION - 3600) * 1000)}-0"
        await redis.xadd(keys.dead_letter, {"reason": "from last month"}, id=old_id)
        await redis.xadd(keys.requests, {"e": raw})
        outcome = await read_until_terminal(redis, keys, cid, timeout=10)
        assert outcome.error is not None and outcome.error["status_code"] == 400
        letters = await redis.xrange(keys.dead_letter)
        ttl = await redis.ttl(keys.dead_letter)
    (letter,) = [fields for _id, fields in letters]  # the old one was trimmed away
    stored = b"".join(k + v for k, v in letter.items())
    assert SECRET_PROMPT.encode() not in stored and SECRET_PRINCIPAL.encode() not in stored
    assert b"admin" not in stored
    original = json.loads(letter[b"original"])
    assert original["fields"]["e"] == {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    assert original["routing"] == {"v": 1, "kind": "request", "completion_id": cid}
    assert letter[b"reason"].startswith(b"400 invalid_request")
    assert len(stored) < 4096
    assert 0 < ttl <= DEAD_LETTER_RETENTION


def test_a_dead_letter_describes_an_oversized_original_by_size_and_digest_only() -> None:
    big = json.dumps({"completion_id": "c", "messages": [{"content": "x" * 500_000}]}).encode()
    described = json.loads(describe({b"e": big, b"junk": b"\xff" * 10}))
    assert described["routing"] == {}
    assert described["fields"]["e"]["bytes"] == len(big)
    assert set(described["fields"]) == {"e", "junk"}
    assert DEAD_LETTER_MAXLEN * 4096 <= 64 * 1024 * 1024  # the stream's bound in bytes


async def test_a_dead_letters_original_is_kept_for_a_day_for_requeueing_unless_too_large(redis_url, prefix) -> None:
    client, keys = connect(redis_url, retries=0), Keys(prefix)
    small, large = {b"e": b'{"kind": "hop"}'}, {b"e": b"x" * (ORIGINAL_BYTES + 1)}
    try:
        for entry_id, fields in (("1-1", small), ("1-2", large)):
            await send_dead_letter(
                client, keys.dead_letter, source=keys.requests, entry_id=entry_id, reason="test",
                fields=fields, consumer="t",
            )
        kept = original_key(keys.dead_letter, keys.requests, "1-1")
        assert await client.hgetall(kept) == small
        assert 0 < await client.ttl(kept) <= ORIGINAL_RETENTION
        assert not await client.exists(original_key(keys.dead_letter, keys.requests, "1-2"))
        assert await client.xlen(keys.dead_letter) == 2  # both dead letters are there
    finally:
        await client.aclose()
