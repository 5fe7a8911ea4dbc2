"""A long streamed answer through a worker group's on_chunk hook costs what the answer costs
(protocol 1.1, bus/wire/stream_text.py): the hops of one answer carry its text about once,
not the text so far once per hop; and every chunk's hook still reads the right
`full_content`, across batches, across replicas that take turns, and across a replica that
leaves mid-answer for one that never saw the stream."""

from __future__ import annotations

import asyncio

import pytest

from hookbus import Agent
from hookbus.services.worker.host import GroupHost
from hookbus.services.worker.replica import WorkerReplica
from hookbus.skills import Context, HookData, Skill, hook
from tests.integration.stack import running_stack, wait_for_groups
from tests.waiting import wait_for

WORDS = 160
ANSWER = " ".join(f"{i:05d}" + "x" * 495 for i in range(WORDS))
"""160 words of 500 characters: the offline model streams one word per chunk (80 KB)."""


class Watch(Skill):
    """Records each chunk's index, text and text so far as its hook saw them."""

    name = "watch"

    def __init__(self) -> None:
        self.seen: list[tuple[int, str, str]] = []

    @hook("on_chunk")
    async def read(self, data: HookData, ctx: Context) -> None:
        self.seen.append((data.chunk_index or 0, data.content or "", data.full_content or ""))


def _check_texts(seen: list[tuple[int, str, str]], answer: str) -> None:
    """Each chunk's hook was called once, in order, and read the text of every chunk before it and its own."""
    assert [index for index, _, _ in seen] == list(range(len(seen)))
    so_far = ""
    for _, content, full in seen:
        so_far += content
        assert full == so_far
    assert so_far == answer


async def _hop_bytes(redis: object, prefix: str) -> int:
    """Bytes of every hop entry's fields on the group's hook streams (a pinned version's too)."""
    total = 0
    async for key in redis.scan_iter(match=f"{prefix}hooks:watch*"):  # type: ignore[attr-defined]
        for _, fields in await redis.xrange(key):  # type: ignore[attr-defined]
            total += sum(len(k) + len(v) for k, v in fields.items())
    return total


async def _streamed(client: object, prompt: str) -> str:
    text = []
    async for chunk in client.stream(prompt):  # type: ignore[attr-defined]
        text.extend(c.delta.content or "" for c in chunk.choices)
    return "".join(text)


PER_HOP = 1500
"""Bytes of a hop's own fields (its envelope, the request's context) and of a chunk's JSON
around its text: what a hop costs whatever the answer's length."""


@pytest.mark.parametrize(("replicas", "most"), [(1, 1.2), (2, 2.4)])
async def test_a_long_answer_s_hops_carry_its_text_about_once(redis_url, prefix, replicas, most):
    """One replica: each chunk's text once. Two taking turns: each hop also carries the
    batch before it, which the other replica lacks. Before protocol 1.1 each hop carried
    the text so far: some forty times the answer here."""
    watch = Watch()
    async with running_stack(redis_url, prefix, Agent("long"), {"watch": [watch]}, replicas=replicas) as (client, services, _):
        answer = await _streamed(client, f"[[delay:2]] [[echo]] {ANSWER}")
        sent = await _hop_bytes(client.redis, prefix)
        assert services[0].runtime is not None
        hops = services[0].runtime.hops
    assert answer == ANSWER
    _check_texts(watch.seen, ANSWER)
    assert hops > 5  # batches, not one hop for the whole answer
    assert sent <= most * len(ANSWER) + PER_HOP * hops, f"{sent} bytes of hops for a {len(ANSWER)}-byte answer in {hops} hops"


async def test_a_replica_that_joins_mid_answer_learns_the_text_and_takes_over(redis_url, prefix):
    """The only replica leaves mid-answer (drained) for one that never saw the stream: the
    hops bring it the text so far, its hooks read it right."""
    watch = Watch()
    async with running_stack(redis_url, prefix, Agent("long"), {"watch": [watch]}) as (client, services, workers):
        runtime = services[0].runtime
        assert runtime is not None
        streamed = asyncio.ensure_future(_streamed(client, f"[[delay:8]] [[echo]] {ANSWER}"))

        async def a_quarter_seen() -> bool:
            return len(watch.seen) >= WORDS // 4

        assert await wait_for(a_quarter_seen, timeout=20)
        other = WorkerReplica(GroupHost("watch", [watch]), redis_url, prefix=prefix, concurrency=8, replica="watch-b")
        await other.start()
        try:

            async def both_live() -> bool:
                await runtime.registry.refresh()
                return sorted(runtime.registry.replicas("watch")) == ["watch-0", "watch-b"]

            assert await wait_for(both_live, timeout=10)
            await workers[0].stop()
            assert len(watch.seen) < WORDS  # it left before the answer's end
            answer = await asyncio.wait_for(streamed, timeout=60)
            assert other.processed > 0
        finally:
            await other.stop()
    assert answer == ANSWER
    _check_texts(watch.seen, ANSWER)


async def test_a_replica_that_lacks_the_text_asks_for_it(redis_url, prefix):
    """A replica that keeps less than the answer (its bound, or a restart) lacks the text
    its hops extend: it asks, the batch goes again with the whole text, the hooks read it
    right."""
    watch = Watch()
    worker = WorkerReplica(
        GroupHost("watch", [watch], kept_chars=len(ANSWER) // 4), redis_url, prefix=prefix, concurrency=8,
        replica="forgetful",
    )
    await worker.start()
    try:
        async with running_stack(redis_url, prefix, Agent("long")) as (client, services, _):
            runtime = services[0].runtime
            assert runtime is not None
            await wait_for_groups(services, 1)
            answer = await _streamed(client, f"[[delay:2]] [[echo]] {ANSWER}")
    finally:
        await worker.stop()
    assert answer == ANSWER
    _check_texts(watch.seen, ANSWER)
    assert runtime.texts_resent >= 1
