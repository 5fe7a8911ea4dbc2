"""Which request entries an orchestrator runs: the entry checked against the request limits
and decoded, and one it will not run set aside.

A refused entry is dead-lettered and acked in one ordered step; its client is told why
(a 400, or a 413 for one over its size limits: hookbus.bus.limits, the same limits the
gateway applies, plus room for the envelope's own fields) when its completion id can be
read, even from an entry that cannot be decoded.
"""

from __future__ import annotations

import json
import re
from typing import Any, Protocol

import redis.asyncio as aredis
import structlog

from hookbus.bus.connection.cluster import in_order
from hookbus.bus.groups.dead_letters import add_dead_letter
from hookbus.bus.keys import ORCHESTRATOR_GROUP, Keys
from hookbus.bus.limits import InvalidJSON, LimitExceeded, RequestLimits, check_document, parse_json
from hookbus.bus.store.journal import Begun
from hookbus.bus.store.response_stream import RESPONSE_TTL
from hookbus.bus.wire.envelopes import (
    FIELD,
    DecodeError,
    RequestEnvelope,
    ResponseItem,
    decode,
    encode,
)
from hookbus.services.process.offload import is_large, off_loop
from hookbus.skills import HookbusError, ServiceError
from hookbus.skills.errors import DuplicateCompletionId

log = structlog.get_logger("hookbus.orchestrator")

_CID = re.compile(rb'"completion_id"\s*:\s*"([^"\\]{1,200})"')


class AdmissionHost(Protocol):
    """What admission reads of the orchestrator service, when it asks (a test changes the
    limits of a running service)."""

    keys: Keys
    instance: str
    limits: RequestLimits

    @property
    def client(self) -> aredis.Redis: ...


class Admission:
    """The service's door: each entry read or claimed passes here before it runs."""

    def __init__(self, service: AdmissionHost) -> None:
        self.service = service
        self.refused = 0

    async def admit(self, stream: str, entry_id: str, fields: dict[bytes, bytes]) -> RequestEnvelope | None:
        """The request, or None when it was refused (dead-lettered, acked, and the client
        told with a 413 or 400 if its completion id could be read). A request on another
        shard than its completion id's is refused too: its journal scripts would span two
        slots (HookbusClient always queues on the right one)."""
        keys = self.service.keys
        raw = fields.get(FIELD)
        if raw is not None:
            limits = self.service.limits.for_envelope()
            try:
                await off_loop(is_large(size=len(raw)), _check_limits, raw, limits)
            except LimitExceeded as refused:
                await self.refuse(stream, entry_id, fields, _peek_completion_id(raw, parse=False), refused)
                return None
            except InvalidJSON:
                pass  # decode says why, below
        try:
            request = await off_loop(is_large(size=len(raw or b"")), decode, fields, RequestEnvelope)
        except DecodeError as exc:
            error = ServiceError(400, "invalid_request", f"the request could not be read: {exc}")
            await self.refuse(stream, entry_id, fields, _peek_completion_id(raw), error)
            return None
        if keys.requests_for(request.completion_id) != stream:
            error = ServiceError(
                400, "misrouted_request",
                f"queued on {stream}, but its completion id belongs to {keys.requests_for(request.completion_id)}",
            )
            await self.refuse(stream, entry_id, fields, request.completion_id, error)
            return None
        return request

    async def refuse(
        self, stream: str, entry_id: str, fields: dict[bytes, bytes], completion_id: str | None, error: HookbusError
    ) -> None:
        """Dead-letter the entry, answer its client (`completion_id`: whom) with `error`, then ack."""
        keys, instance = self.service.keys, self.service.instance

        def set_aside(pipe: Any) -> None:
            add_dead_letter(
                pipe, keys.dead_letter, source=stream, entry_id=entry_id,
                reason=f"{error.status_code} {error.code}: {error.message}", fields=fields,
                consumer=instance,
            )
            if completion_id:
                responses = keys.responses(completion_id)
                item = ResponseItem(kind="error", completion_id=completion_id, error=error.to_dict())
                pipe.xadd(responses, encode(item))
                pipe.expire(responses, RESPONSE_TTL)

        await in_order(
            self.service.client, set_aside, lambda pipe: pipe.xack(stream, ORCHESTRATOR_GROUP, entry_id)
        )
        self.refused += 1
        log.warning(
            "bad_request_dead_lettered", entry_id=entry_id, completion_id=completion_id,
            status=error.status_code, reason=error.message,
        )

    async def not_ours(
        self, stream: str, entry_id: str, fields: dict[bytes, bytes], request: RequestEnvelope, begun: Begun
    ) -> None:
        """An admitted entry whose journal would not begin here: taken over, or a duplicate."""
        cid = request.completion_id
        if begun.entry == entry_id:
            # Another orchestrator claimed it while it waited in our prefetch buffer.
            log.info("request_taken_over", completion_id=cid, owner=begun.owner)
            return
        error = DuplicateCompletionId(cid)
        if begun.done:  # the first one is over: its client is gone, tell this one
            await self.refuse(stream, entry_id, fields, cid, error)
        else:  # the first one still runs: do not disturb its response stream
            await self.refuse(stream, entry_id, fields, None, error)


def _check_limits(raw: bytes, limits: RequestLimits) -> None:
    check_document(parse_json(raw, limits), limits)


def _peek_completion_id(raw: bytes | None, *, parse: bool = True) -> str | None:
    """The completion id of an unreadable request, if it can be found (to answer it)."""
    if not raw:
        return None
    match = _CID.search(raw[:4096])
    if match:
        return match.group(1).decode(errors="replace")
    if not parse:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    cid = value.get("completion_id") if isinstance(value, dict) else None
    return cid if isinstance(cid, str) and 0 < len(cid) <= 200 else None
