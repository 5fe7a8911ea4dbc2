"""MemorySkill against the real embedded Redis: one episode per compaction, per caller,
searchable by the model through its tools."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aredis

from hookbus import Agent, CompactionPolicy
from hookbus.skills.builtin import MemorySkill
from hookbus.skills.context import AuthInfo, Context, Metadata
from tests.conversations import conversation


@pytest.fixture
async def memory(redis_url: str, prefix: str) -> AsyncIterator[MemorySkill]:
    skill = MemorySkill(redis_url=redis_url, prefix=prefix, owner="alice")
    yield skill
    await skill.close()


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aredis.Redis]:
    client = aredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def stored(redis: aredis.Redis, key: str) -> list[dict[str, Any]]:
    return [json.loads(m) for m in await redis.zrange(key, 0, -1)]


def agent_with(memory: MemorySkill, **options: Any) -> Agent:
    return Agent("a", skills=[memory], compaction_policy=CompactionPolicy(window=1000), **options)


async def test_one_compaction_gives_one_episode_for_the_owner(memory, redis, prefix) -> None:
    agent = agent_with(memory)
    outcome = await agent.compact(conversation(3), focus="the budget decisions")

    episodes = await stored(redis, f"{prefix}memory:alice")
    assert episodes == [
        {
            "id": outcome.id,
            "ts": outcome.created,
            "stage": "summarized",
            "summary": outcome.summary,
            "focus": "the budget decisions",
            "sentence": outcome.sentence(),
            "counts": {"summarized": 4, "kept": 2, "cleared": 0, "dropped": 0},
            "tokens": {"before": outcome.before, "after": outcome.after, "window": 1000},
            "completion_id": None,
        }
    ]
    assert outcome.summary.startswith("Summary: Focus: the budget decisions.")

    # a second compaction, a second episode; no compaction, no episode
    assert (await agent.compact_if_needed(conversation(1), 10)).stage == "none"
    await agent.compact(conversation(4))
    assert len(await stored(redis, f"{prefix}memory:alice")) == 2


async def test_a_redelivered_compaction_is_stored_once(memory, redis, prefix) -> None:
    outcome = await Agent("a", compaction_policy=CompactionPolicy(window=1000)).compact(conversation(3))
    await memory.on_compaction(outcome, None)
    await memory.on_compaction(outcome, None)
    await memory.on_compaction(outcome.model_copy(), None)
    assert len(await stored(redis, f"{prefix}memory:alice")) == 1


async def test_episodes_are_kept_per_caller(memory, redis, prefix) -> None:
    outcome = await Agent("a", compaction_policy=CompactionPolicy(window=1000)).compact(conversation(3))
    bob = Context(auth=AuthInfo(peer_user_id="bob"), metadata=Metadata(completion_id="chatcmpl-1"))
    anonymous = Context(metadata=Metadata(completion_id="chatcmpl-2"))
    await memory.on_compaction(outcome, bob)
    await memory.on_compaction(outcome, anonymous)
    assert [e["completion_id"] for e in await stored(redis, f"{prefix}memory:bob")] == ["chatcmpl-1"]
    assert [e["completion_id"] for e in await stored(redis, f"{prefix}memory:alice")] == ["chatcmpl-2"]


async def test_an_in_run_compaction_is_remembered_for_the_caller_and_found_by_the_tools(
    memory, redis, prefix
) -> None:
    agent = Agent("a", model="offline-small", skills=[memory], max_tool_rounds=3)
    history = conversation(12, words=120)  # about 3100 tokens: under `hard` (3891)
    await agent.run([*history, {"role": "user", "content": "hello"}], auth={"peer_user_id": "carol"})
    assert await stored(redis, f"{prefix}memory:carol") == []

    # with `hard` at 70% the same history is over it: the run compacts before its first call,
    # and the tool it then calls already finds the episode
    agent.compaction_policy = CompactionPolicy(at=0.6, hard=0.7)
    request = [*history, {"role": "user", "content": "[[tool:list_memory]]"}]
    listed = await agent.run(request, auth={"peer_user_id": "carol"})
    episodes = await stored(redis, f"{prefix}memory:carol")
    assert [e["stage"] for e in episodes] == ["summarized"]
    assert episodes[0]["completion_id"] == listed.id
    assert listed.choices[0].message.content.startswith("The tool list_memory returned: 1. [")
    assert "summarized\nSummary: user: Conversation to summarize" in listed.choices[0].message.content

    found = await agent.run(
        '[[tool:search_memory {"query": "conversation summarize"}]]', auth={"peer_user_id": "carol"}
    )
    assert "Summary: user: Conversation to summarize" in found.choices[0].message.content
    missed = await agent.run(
        '[[tool:search_memory {"query": "zebra"}]]', auth={"peer_user_id": "carol"}
    )
    assert missed.choices[0].message.content == (
        "The tool search_memory returned: No memory episodes match 'zebra'."
    )
    nothing = await agent.run("[[tool:list_memory]]", auth={"peer_user_id": "dave"})
    assert nothing.choices[0].message.content == "The tool list_memory returned: No memory episodes yet."


async def test_search_ranks_by_shared_words_then_recency(memory) -> None:
    agent = agent_with(memory)
    await agent.compact(conversation(3), focus="travel budget for Lisbon")
    await agent.compact(conversation(3), focus="hiring plan")
    await agent.compact(conversation(3), focus="budget review")

    ranked = await memory.search("alice", "Lisbon budget", limit=5)
    assert [e["focus"] for e in ranked] == ["travel budget for Lisbon", "budget review"]
    assert [e["focus"] for e in await memory.search("alice", "budget", limit=1)] == ["budget review"]
    assert await memory.search("alice", "nothing matches", limit=5) == []
    newest = await memory.episodes("alice", 2)
    assert [e["focus"] for e in newest] == ["budget review", "hiring plan"]
    assert await memory.episodes("alice", 0) == []


async def test_the_oldest_episodes_beyond_the_cap_are_trimmed(redis_url, prefix, redis) -> None:
    memory = MemorySkill(redis_url=redis_url, prefix=prefix, owner="erin", max_episodes=2)
    agent = agent_with(memory)
    outcomes = [await agent.compact(conversation(3), focus=f"topic {n}") for n in range(3)]
    episodes = await stored(redis, f"{prefix}memory:erin")
    assert [e["id"] for e in episodes] == [o.id for o in outcomes[1:]]
    await memory.close()


async def test_owner_and_prefix_come_from_the_environment(monkeypatch, redis_url, prefix, redis) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("HOOKBUS_PREFIX", prefix)
    monkeypatch.setenv("HOOKBUS_MEMORY_OWNER", "frank")
    memory = MemorySkill()
    assert (memory.redis_url, memory.prefix, memory.owner) == (redis_url, prefix, "frank")
    await agent_with(memory).compact(conversation(3))
    assert len(await stored(redis, f"{prefix}memory:frank")) == 1
    await memory.close()


async def test_one_instance_serves_several_event_loops(memory, redis, prefix) -> None:
    agent = agent_with(memory)
    await agent.compact(conversation(3))

    async def elsewhere() -> None:
        await agent.compact(conversation(3))
        await memory.close()

    await asyncio.to_thread(asyncio.run, elsewhere())
    await agent.compact(conversation(3))
    assert len(await stored(redis, f"{prefix}memory:alice")) == 3


async def test_without_redis_the_run_goes_on_and_the_tools_say_so(monkeypatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    memory = MemorySkill()
    agent = Agent("a", skills=[memory], compaction_policy=CompactionPolicy(window=1000))
    outcome = await agent.compact(conversation(3))  # on_compaction fails: logged only
    assert outcome.stage == "summarized" and agent.last_compaction is outcome
    answer = await agent.run("[[tool:search_memory {\"query\": \"x\"}]]")
    assert answer.choices[0].message.content.startswith(
        "The tool search_memory returned: Memory is unavailable: the memory skill needs Redis"
    )


def test_the_tools_schemas_ask_the_model_only_for_query_and_limit() -> None:
    tools = {t.descriptor.name: t.descriptor.parameters_schema for t in MemorySkill(redis_url="redis://x").bound_tools()}
    search = tools["search_memory"]["function"]["parameters"]
    assert set(search["properties"]) == {"query", "limit"} and search["required"] == ["query"]
    assert set(tools["list_memory"]["function"]["parameters"]["properties"]) == {"limit"}
    # its on_compaction(outcome, ctx) method is a hook on on_compaction, by its name alone
    (listener,) = [h.descriptor for h in MemorySkill(redis_url="redis://x").bound_hooks()]
    assert (listener.key, listener.lifecycle) == ("memory.on_compaction", "on_compaction")
