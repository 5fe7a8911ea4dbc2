"""Bench 7, tokens and compaction on a 100k-token conversation.

The conversation: a system prompt and ~250 user/assistant/tool messages of varied
English-like text (a seeded vocabulary, so BPE does real work), about 100,000 cl100k
tokens in all.

- count_messages cold (the token cache cleared: every text encoded) and warm (every text
  seen before: what the agent pays before each turn);
- the compaction decision between turns (`compact_if_needed`, default policy, 128k
  window: no compaction needed) cold and warm;
- a compaction that does happen (window 100k, so `at` = 80k is passed): clearing tool
  outputs and a summary with an instant stub summarizer (the LLM call left out).

Run alone: `python -m tests.bench.tokens`.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

from tests.bench.common import Row, print_rows, quiet_logs

TARGET_TOKENS = 100_000
WORDS = ["stream", "hook", "redis", "agent", "worker", "replica", "orchestrator", "token", "context", "window", "summary", "compaction", "latency", "throughput", "request", "reply", "envelope", "pydantic", "validate", "message", "assistant", "user", "system", "tool", "call", "result", "session", "state", "priority", "lifecycle", "chunk", "finalize", "connection", "error", "retry", "backoff", "the", "a", "of", "to", "and", "in", "is", "that", "for", "on", "with", "as", "by", "it", "be", "are", "this", "from", "at", "or", "an", "was", "which", "can", "will", "not", "database", "cluster", "index", "query", "schema", "migration", "deploy", "kubernetes", "container", "image", "build", "cache", "python", "asyncio", "event", "loop", "future", "task", "coroutine", "socket", "pipeline", "batch", "queue", "consumer", "group", "ack"]  # noqa: SIM905


def conversation(seed: int = 7) -> list[dict[str, Any]]:
    from hookbus.services.orchestrator.compaction.tokens import count_messages

    rng = random.Random(seed)

    def text(words: int) -> str:
        out = []
        for i in range(words):
            word = rng.choice(WORDS)
            if i % 13 == 0:
                word = word.capitalize()
            out.append(word + ("." if i % 17 == 16 else ","if i % 7 == 6 else ""))
        return " ".join(out)

    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful assistant. " + text(60)}]
    n = 0
    while count_messages(messages) < TARGET_TOKENS:
        n += 1
        messages.append({"role": "user", "content": text(rng.randint(40, 200))})
        if n % 4 == 0:
            call_id = f"call_{n}"
            messages.append({
                "role": "assistant", "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "search", "arguments": json.dumps({"q": text(5)})}}],
            })
            messages.append({"role": "tool", "tool_call_id": call_id, "content": text(rng.randint(300, 900))})
        messages.append({"role": "assistant", "content": text(rng.randint(100, 400))})
    return messages


def clear_cache() -> None:
    from hookbus.services.orchestrator.compaction import tokens

    with tokens._lock:
        tokens._cache.clear()


def best_ms(fn: Any, repeat: int = 5, cold: bool = False) -> float:
    best = float("inf")
    for _ in range(repeat):
        if cold:
            clear_cache()
        began = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - began)
    return best * 1000


async def abest_ms(fn: Any, repeat: int = 5, cold: bool = False) -> float:
    best = float("inf")
    for _ in range(repeat):
        if cold:
            clear_cache()
        began = time.perf_counter()
        await fn()
        best = min(best, time.perf_counter() - began)
    return best * 1000


async def measure() -> list[Row]:
    quiet_logs()
    from hookbus.services.orchestrator.compaction import rules
    from hookbus.services.orchestrator.compaction.rules import CompactionPolicy
    from hookbus.services.orchestrator.compaction.tokens import count_messages, is_exact

    messages = conversation()
    total = count_messages(messages)
    chars = sum(len(m.get("content") or "") for m in messages)
    print(f"\n[tokens] {len(messages)} messages, {total:,} tokens, {chars:,} characters, exact={is_exact()}")

    cold = best_ms(lambda: count_messages(messages), cold=True)
    warm = best_ms(lambda: count_messages(messages), repeat=20)

    async def summarize(request: list[dict[str, Any]]) -> str:
        return "Summary: the user and the assistant talked about streams."

    policy = CompactionPolicy()
    decision = lambda: rules.compact_if_needed(messages, 500, policy, 128_000, summarize)  # noqa: E731
    outcome = await decision()
    assert outcome.stage == "none", outcome.stage
    decide_cold = await abest_ms(decision, cold=True)
    decide_warm = await abest_ms(decision, repeat=20)
    small = CompactionPolicy(window=100_000)
    compact = lambda: rules.compact_if_needed(messages, 500, small, 100_000, summarize)  # noqa: E731
    done = await compact()
    compact_warm = await abest_ms(compact)
    print(f"  count_messages cold {cold:8.2f} ms   warm {warm:8.3f} ms")
    print(f"  compaction decision (none needed) cold {decide_cold:8.2f} ms   warm {decide_warm:8.3f} ms")
    print(f"  compaction that happens: stage={done.stage} {done.before:,} -> {done.after:,} tokens, {compact_warm:8.2f} ms")
    return [
        Row("tokens", "count 100k tokens, cold cache", cold, "ms", target="<50", note=f"{total:,} tokens, {len(messages)} messages"),
        Row("tokens", "count 100k tokens, warm cache", warm, "ms", note="every text seen before (each turn)"),
        Row("tokens", "compaction decision, cold", decide_cold, "ms", note="compact_if_needed, nothing to do"),
        Row("tokens", "compaction decision, warm", decide_warm, "ms"),
        Row("tokens", f"compaction ({done.stage}), stub summarizer", compact_warm, "ms",
            note=f"{done.before:,} -> {done.after:,} tokens"),
    ]


async def main() -> list[Row]:
    rows = await measure()
    print_rows("tokens and compaction", rows)
    return rows


if __name__ == "__main__":
    asyncio.run(main())
