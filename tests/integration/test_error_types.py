"""An error keeps its class over the bus: the orchestrator writes its type with it, the client
raises the same subclass, and a finalize hook in a worker group sees it too. A hook's verdict
is a `HookError`; what fails around the hooks (the bus, a cancellation, the endpoint) is a
`ServiceError`, which a skill's `except HookError` does not catch."""

from __future__ import annotations

import pytest

from hookbus import Agent, HookbusClient, HookbusError, HookError
from hookbus.bus.connection.embedded import free_port
from hookbus.services.gateway.cancel import request_cancel
from hookbus.skills import (
    BusUnavailable,
    Cancelled,
    ContextTooLong,
    DeadlineExceeded,
    DuplicateCompletionId,
    OrchestratorLost,
    ServiceError,
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
    lost = HookbusError.from_dict(OrchestratorLost().to_dict())
    assert type(lost) is OrchestratorLost and lost == OrchestratorLost()
    forged = HookbusError.from_dict({"type": "SystemExit", "status_code": 500, "code": "x", "message": "m"})
    assert type(forged) is HookError
    assert HookbusError.from_dict(QuotaExceeded().to_dict()).to_dict()["type"] == "HookError"


class Relay(Skill):
    """An on_connection hook that asks another hookbus first. Its `except HookError` is meant
    for that side's hook verdicts (a 402, say); whatever else it meets is recorded and raised."""

    name = "relay"

    def __init__(self, other: HookbusClient, completion_id: str | None = None) -> None:
        self.other, self.completion_id = other, completion_id
        self.verdicts: list[str] = []
        self.met: list[str] = []

    @hook("on_connection")
    async def ask_first(self, data, ctx):
        try:
            await self.other.complete("[[echo]] asked first", completion_id=self.completion_id)
        except HookError as exc:
            self.verdicts.append(exc.code)
        except HookbusError as exc:
            self.met.append(type(exc).__name__)
            raise


async def test_a_skills_except_hook_error_does_not_catch_a_bus_outage() -> None:
    relay = Relay(HookbusClient(f"redis://127.0.0.1:{free_port()}/0", timeout=1.0))
    try:
        completion = await Agent("front", skills=[relay]).run("[[echo]] answered anyway")
    finally:
        await relay.other.close()
    assert relay.verdicts == [] and relay.met == ["BusUnavailable"]
    # the outage was the hook failing (logged, its changes undone), not its verdict: the run went on
    assert completion.choices[0].message.content == "answered anyway"


async def test_a_skills_except_hook_error_does_not_catch_a_cancellation(redis_url, prefix):
    async with running_stack(redis_url, prefix, Agent("back")) as (client, _, _):
        assert await request_cancel(client.redis, client.keys, "chatcmpl-cancelled-first")
        relay = Relay(client, "chatcmpl-cancelled-first")
        completion = await Agent("front", skills=[relay]).run("[[echo]] answered anyway")
    assert relay.verdicts == [] and relay.met == ["Cancelled"]
    assert completion.choices[0].message.content == "answered anyway"


def test_service_errors_and_hook_errors_are_two_branches_of_one_base() -> None:
    for error in (Cancelled(), BusUnavailable("down"), DeadlineExceeded(), UpstreamError(502, "x", "y")):
        assert isinstance(error, ServiceError) and isinstance(error, HookbusError)
        assert not isinstance(error, HookError)
    assert not isinstance(HookError(402, "payment_required", "pay"), ServiceError)
    # the client-facing form is unchanged: status, code and body
    assert Cancelled().to_openai_body()["error"]["code"] == "cancelled"
    assert HookbusError.from_dict(BusUnavailable("down").to_dict()) == BusUnavailable("down")
