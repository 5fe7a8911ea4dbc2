"""MemorySkill: keeps every compaction summary as an episode in Redis, and lets the model
search and list them.

When an agent compacts a conversation, the older part becomes a summary and the original
messages are gone from the context. This skill keeps each such compaction as an *episode*
so that what was summarized away can still be looked up later, in this conversation or a
new one.

Episodes are kept per caller: `ctx.auth.peer_user_id` inside a request, and the agent's
owner between turns (when `on_compaction` gets `ctx=None`, e.g. the chat REPL calling
`compact_if_needed`), or when the caller is anonymous. The owner is the `owner` argument,
else the environment variable `HOOKBUS_MEMORY_OWNER`, else `"owner"`.

Storage: one sorted set per owner, key `{HOOKBUS_PREFIX}memory:{owner}`, whose members are
JSON episodes scored by the compaction's time:

    {"id", "ts", "stage", "summary", "focus", "sentence",
     "counts": {"summarized", "kept", "cleared", "dropped"},
     "tokens": {"before", "after", "window"}, "completion_id"}

An episode is built only from the compaction outcome (its `id` and `created` time) and
the request, so the same compaction delivered twice (a redelivered hop, or the skill
running both in-process and in a worker group) is stored once. Every compaction that
changed something gives one episode; `summary` is null for a compaction that only cleared
tool outputs or dropped turns. The oldest episodes beyond `max_episodes` are trimmed.

Tools (run where the skill runs):
- `search_memory(query, limit=5)`: the episodes whose summary or focus share the most
  words with the query, best first (ties: newest first).
- `list_memory(limit=10)`: the newest episodes first.

Configuration (constructor keywords, else environment):
    redis_url: `REDIS_URL`. Without one the skill cannot store anything: `on_compaction`
        fails (logged by the agent, the run goes on) and the tools say so.
    prefix: `HOOKBUS_PREFIX`, default "hookbus:".
    owner: `HOOKBUS_MEMORY_OWNER`, default "owner".
    max_episodes: per owner, default 1000.

This skill reads Redis itself (through the `redis` package, one asyncio client per event
loop, so one instance serves agents used from several loops one after another); the
skills SDK it is built on stays free of Redis.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import weakref
from typing import Any

from hookbus.skills.builtin._common import logger
from hookbus.skills.context import Context
from hookbus.skills.decorators import tool
from hookbus.skills.skill import Skill

LOGGER_NAME = "hookbus.skills.memory"
DEFAULT_OWNER = "owner"
MAX_LIMIT = 50
_WORD = re.compile(r"\w+")


class MemoryUnavailable(RuntimeError):
    """No Redis configured for the memory skill."""


class MemorySkill(Skill):
    """Compaction summaries as searchable episodes, per caller (see the module docstring)."""

    name = "memory"

    def __init__(
        self,
        *,
        redis_url: str | None = None,
        prefix: str | None = None,
        owner: str | None = None,
        max_episodes: int = 1000,
    ) -> None:
        if max_episodes < 1:
            raise ValueError("max_episodes must be >= 1")
        self._redis_url = redis_url
        self.prefix = prefix or os.environ.get("HOOKBUS_PREFIX") or "hookbus:"
        self.owner = owner or os.environ.get("HOOKBUS_MEMORY_OWNER") or DEFAULT_OWNER
        self.max_episodes = max_episodes
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )

    # ----------------------------------------------------------------- storage

    @property
    def redis_url(self) -> str | None:
        return self._redis_url or os.environ.get("REDIS_URL") or None

    def key(self, owner: str) -> str:
        return f"{self.prefix}memory:{owner}"

    def owner_of(self, ctx: Context | None) -> str:
        """Whose memory: the caller inside a request, the agent's owner otherwise."""
        if ctx is not None and ctx.auth.peer_user_id:
            return ctx.auth.peer_user_id
        return self.owner

    def _redis(self) -> Any:
        """This event loop's client (asyncio clients are bound to the loop that made them)."""
        url = self.redis_url
        if not url:
            raise MemoryUnavailable("the memory skill needs Redis: set REDIS_URL or pass redis_url")
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            import redis.asyncio as aredis

            client = aredis.Redis.from_url(url)
            self._clients[loop] = client
        return client

    async def close(self) -> None:
        """Close this event loop's client (optional; clients of finished loops are dropped)."""
        with_loop = self._clients.pop(asyncio.get_running_loop(), None)
        if with_loop is not None:
            await with_loop.aclose()

    @staticmethod
    def episode(outcome: Any, ctx: Context | None) -> dict[str, Any]:
        """The episode a compaction outcome gives; the same outcome always gives the same one."""
        return {
            "id": outcome.id,
            "ts": outcome.created,
            "stage": outcome.stage,
            "summary": outcome.summary,
            "focus": outcome.focus,
            "sentence": outcome.sentence(),
            "counts": {
                "summarized": outcome.summarized,
                "kept": outcome.kept,
                "cleared": outcome.cleared,
                "dropped": outcome.dropped,
            },
            "tokens": {"before": outcome.before, "after": outcome.after, "window": outcome.window},
            "completion_id": ctx.completion_id if ctx is not None else None,
        }

    async def remember(self, outcome: Any, ctx: Context | None = None) -> dict[str, Any]:
        """Store the outcome's episode for its owner (once, however often it is delivered)."""
        episode = self.episode(outcome, ctx)
        member = json.dumps(episode, sort_keys=True, separators=(",", ":"))
        key = self.key(self.owner_of(ctx))
        async with self._redis().pipeline(transaction=True) as pipe:
            pipe.zadd(key, {member: float(episode["ts"])})
            pipe.zremrangebyrank(key, 0, -self.max_episodes - 1)
            await pipe.execute()
        return episode

    async def episodes(self, owner: str, limit: int | None = None) -> list[dict[str, Any]]:
        """An owner's episodes, newest first (all of them when `limit` is None)."""
        if limit is not None and limit <= 0:
            return []
        raw = await self._redis().zrevrange(self.key(owner), 0, -1 if limit is None else limit - 1)
        found = []
        for item in raw:
            try:
                found.append(json.loads(item))
            except ValueError:
                continue
        return found

    async def search(self, owner: str, query: str, limit: int = 5) -> list[dict[str, Any]]:
        """Episodes sharing words with `query`, most shared words first, then newest first."""
        terms = set(_words(query))
        if not terms or limit <= 0:
            return []
        phrase = " ".join(_words(query))
        scored = []
        for rank, episode in enumerate(await self.episodes(owner)):
            words = _words(" ".join(str(episode.get(k) or "") for k in ("summary", "focus")))
            score = len(terms & set(words))
            if score and len(terms) > 1 and phrase in " ".join(words):
                score += 1  # the query as a phrase ranks above its words scattered
            if score:
                scored.append((-score, rank, episode))
        scored.sort(key=lambda item: (item[0], item[1]))
        return [episode for _, _, episode in scored[:limit]]

    # ------------------------------------------------------------- the skill

    async def on_compaction(self, outcome: Any, ctx: Context | None) -> None:
        """One compaction, one episode."""
        if outcome.stage == "none":
            return
        episode = await self.remember(outcome, ctx)
        if ctx is not None:
            logger(LOGGER_NAME, ctx).info(
                "memory_episode_stored", owner=self.owner_of(ctx), episode=episode["id"]
            )

    @tool
    async def search_memory(self, query: str, limit: int = 5, *, ctx: Context) -> str:
        """Search the summaries of earlier, compacted conversation for what was asked, decided or done.

        Args:
            query: words to look for (names, topics, numbers)
            limit: most episodes to return (1-50)
        """
        try:
            found = await self.search(self.owner_of(ctx), query, _clamp(limit))
        except MemoryUnavailable as exc:
            return f"Memory is unavailable: {exc}"
        if not found:
            return f"No memory episodes match {query!r}."
        return _render(found)

    @tool
    async def list_memory(self, limit: int = 10, *, ctx: Context) -> str:
        """List the most recent memory episodes (summaries of compacted conversation), newest first.

        Args:
            limit: most episodes to return (1-50)
        """
        try:
            found = await self.episodes(self.owner_of(ctx), _clamp(limit))
        except MemoryUnavailable as exc:
            return f"Memory is unavailable: {exc}"
        if not found:
            return "No memory episodes yet."
        return _render(found)


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _clamp(limit: int) -> int:
    return max(1, min(MAX_LIMIT, int(limit)))


def _render(episodes: list[dict[str, Any]]) -> str:
    lines = []
    for n, episode in enumerate(episodes, 1):
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(episode.get("ts") or 0)))
        head = f"{n}. [{when}] {episode.get('stage')}"
        if episode.get("focus"):
            head += f" (focus: {episode['focus']})"
        body = episode.get("summary") or episode.get("sentence") or ""
        lines.append(f"{head}\n{body}")
    return "\n\n".join(lines)
