"""The hold-back window: text reaches the client only after the on_chunk hooks judged what
follows it, so a phrase rejected at its last piece never reaches the client at all."""

from __future__ import annotations

import pytest
from openai.types.chat import ChatCompletionChunk

from hookbus import Agent
from hookbus.services.orchestrator.hold_back import HoldBack
from hookbus.skills import Context, HookData, HookError, Skill, hook


def chunk(text: str | None, finish: str | None = None) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate({
        "id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
    })


def texts(chunks: list[ChatCompletionChunk]) -> list[str | None]:
    return [c.choices[0].delta.content for c in chunks]


def test_the_last_n_characters_stay_held_and_a_chunk_is_split_where_the_window_starts() -> None:
    hold = HoldBack(5)
    assert texts(hold.take(chunk("abc"))) == []
    assert texts(hold.take(chunk(None))) == []  # no text: keeps its place behind "abc"
    assert texts(hold.take(chunk("defgh"))) == ["abc", None]
    assert texts(hold.take(chunk("ij"))) == ["de"]  # "fgh" + "ij" held: 5 characters
    assert texts(hold.rest()) == ["fgh", "ij"]


def test_a_window_needs_at_least_one_character() -> None:
    with pytest.raises(ValueError):
        HoldBack(0)


class PhraseGuard(Skill):
    """Refuses a stream once its text contains the phrase (only recognisable at its end)."""

    name = "phrase-guard"

    def __init__(self, phrase: str = "top secret") -> None:
        self.phrase = phrase

    @hook("on_chunk", hold_back=16)
    async def judge(self, data: HookData, ctx: Context) -> None:
        if self.phrase in (data.full_content or ""):
            raise HookError(451, "content_blocked", "the answer contained a blocked phrase")


async def test_a_rejected_phrase_split_over_chunks_never_reaches_the_client_in_process() -> None:
    agent = Agent("t", skills=[PhraseGuard()])
    received: list[str] = []
    with pytest.raises(HookError) as refused:
        async for c in agent.run_stream("[[echo]] the plan is top secret and more"):
            if c.choices and c.choices[0].delta.content:
                received.append(c.choices[0].delta.content)
    assert refused.value.code == "content_blocked"
    text = "".join(received)
    assert "top" not in text and "secret" not in text
    assert text == "the plan"[: len(text)]


async def test_an_accepted_stream_arrives_whole_through_the_window() -> None:
    agent = Agent("t", skills=[PhraseGuard()])
    received = [
        c.choices[0].delta.content or "" async for c in agent.run_stream("[[words:30]]") if c.choices
    ]
    assert "".join(received) == " ".join(f"w{n}" for n in range(30))
