"""An error keeps its class over the bus: the orchestrator writes its type with it, the client
raises the same subclass of HookError, and a finalize hook in a worker group sees it too."""

from __future__ import annotations

import pytest

from hookbus import Agent, HookError
from hookbus.skills import (
    ContextTooLong,
    DeadlineExceeded,
    DuplicateCompletionId,
    OrchestratorLost,
    Skill,
    UpstreamError,
    hook,
)
from tests.integration.stack import running_stack


class ErrorWitness(Skill):
    """A remote finalize hook: which class `data.error` arrived as in the worker."""

    name = "error-witness"
    seen: list[tuple[str, int, str]] = []

    @hook("finalize_connection")
    async def witness(self, data, ctx):
        if data.error is not None:
            ErrorWitness.seen.append((type(data.error).__name__, data.error.status_code, data.error.code))


class QuotaExceeded(HookError):
    """A skill's own subclass: not one of hookbus's, so it travels as its hookbus base."""

    def __init__(self) -> None:
        super().__init__(429, "quota_exceeded", "over the quota")


class Quota(Skill):
    name = "quota"

    @hook("on_connection")
    async def check(self, data, ctx):
        if "[[quota]]" in str(data.messages[-1]["content"]):
            raise QuotaExceeded()


async def test_each_error_reaches_the_client_and_a_worker_as_its_own_class(redis_url, prefix):
    ErrorWitness.seen = []
    agent = Agent("typed-errors", model="offline-tiny")
    groups = {"witness": [ErrorWitness(), Quota()]}
    async with running_stack(redis_url, prefix, agent, groups) as (client, _, _):
        with pytest.raises(UpstreamError) as upstream:
            await client.complete("[[error:500]]")  # the endpoint failing us: a 502
        assert upstream.value.status_code == 502

        with pytest.raises(ContextTooLong) as too_long:  # one turn alone over offline-tiny's window
            await client.complete("word " * 3000)
        assert too_long.value.code == "context_length_exceeded"

        with pytest.raises(HookError) as quota:
            await client.complete("[[quota]]")
        assert type(quota.value) is HookError and quota.value.code == "quota_exceeded"

        await client.complete("first", completion_id="chatcmpl-twice")
        with pytest.raises(DuplicateCompletionId):
            await client.complete("second", completion_id="chatcmpl-twice")

        with pytest.raises(DeadlineExceeded):
            await client.complete("[[delay:2500]] hi", timeout=1.0)
    assert ("UpstreamError", 502, upstream.value.code) in ErrorWitness.seen
    assert ("ContextTooLong", 400, "context_length_exceeded") in ErrorWitness.seen
    assert ("HookError", 429, "quota_exceeded") in ErrorWitness.seen


def test_an_error_rebuilds_as_its_class_and_never_as_a_class_the_sender_names() -> None:
    lost = HookError.from_dict(OrchestratorLost().to_dict())
    assert type(lost) is OrchestratorLost and lost == OrchestratorLost()
    forged = HookError.from_dict({"type": "SystemExit", "status_code": 500, "code": "x", "message": "m"})
    assert type(forged) is HookError
    assert HookError.from_dict(QuotaExceeded().to_dict()).to_dict()["type"] == "HookError"
