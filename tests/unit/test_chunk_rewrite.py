"""on_chunk: `content` and the chunk's text are one value for the next hook, whichever of the
two a hook rewrote; `full_content` stays the model's text (docs/hooks.md). The TypeScript
runner keeps the same rule (skills/typescript/test/host.test.ts)."""

from __future__ import annotations

from typing import Any

from openai.types.chat import ChatCompletionChunk

from hookbus.skills import Context, HookData, Skill, hook
from hookbus.skills.runner import run_hooks


class Rewrite(Skill):
    name = "rewrite"

    @hook("on_chunk", 1)
    async def via_chunk(self, data: HookData, ctx: Context) -> None:
        if data.content == " b" and data.chunk is not None:
            data.chunk.choices[0].delta.content = "[filtered]"

    @hook("on_chunk", 2)
    async def via_content(self, data: HookData, ctx: Context) -> None:
        if data.content == " c":
            data.content = "[C]"

    @hook("on_chunk", 3)
    async def sees(self, data: HookData, ctx: Context) -> None:
        assert data.chunk is not None
        ctx.state.setdefault("seen", []).append([data.content, data.chunk.choices[0].delta.content, data.full_content])


def chunk_data(content: str, full: str) -> HookData:
    chunk = ChatCompletionChunk.model_validate({
        "id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"content": content}}],
    })
    return HookData(lifecycle="on_chunk", chunk=chunk, content=content, chunk_index=0, full_content=full)


async def test_the_next_hook_sees_content_and_chunk_text_agree_and_full_content_unchanged() -> None:
    ctx = Context()
    results: list[Any] = []
    for content, full in ((" a", " a"), (" b", " a b"), (" c", " a b c")):
        result = await run_hooks(Rewrite().bound_hooks(), chunk_data(content, full), ctx)
        assert result.data.chunk is not None
        results.append((result.data.content, result.data.chunk.choices[0].delta.content))
    assert ctx.state["seen"] == [[" a", " a", " a"], ["[filtered]", "[filtered]", " a b"], ["[C]", "[C]", " a b c"]]
    assert results == [(" a", " a"), ("[filtered]", "[filtered]"), ("[C]", "[C]")]
