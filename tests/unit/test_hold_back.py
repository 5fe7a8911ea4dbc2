"""The hold-back window: text reaches the client only after the on_chunk hooks judged what
follows it, so a phrase rejected at its last piece never reaches the client at all."""

from __future__ import annotations

import pytest
from openai.types.chat import ChatCompletionChunk

from hookbus import Agent
from hookbus.services.orchestrator.streaming.hold_back import HoldBack
from hookbus.skills import Context, HookData, HookError, Skill, hook


def chunk(text: str | None, finish: str | None = None) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate({
        "id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
    })


def texts(chunks: list[ChatCompletionChunk]) -> list[str | None]:
    return [c.choices[0].delta.content for c in chunks]


def take(hold: HoldBack, c: ChatCompletionChunk) -> list[ChatCompletionChunk]:
    hold.hold(c)
    return hold.release()


def test_the_last_n_characters_stay_held_and_a_chunk_is_split_where_the_window_starts() -> None:
    hold = HoldBack(5)
    assert texts(take(hold, chunk("abc"))) == []
    assert texts(take(hold, chunk(None))) == []  # no text: keeps its place behind "abc"
    assert texts(take(hold, chunk("defgh"))) == ["abc", None]
    assert texts(take(hold, chunk("ij"))) == ["de"]  # "fgh" + "ij" held: 5 characters
    assert hold.text() == "fghij"
    assert texts(hold.rest()) == ["fgh", "ij"]


def test_a_window_of_0_holds_nothing_and_a_negative_one_is_refused() -> None:
    hold = HoldBack(0)
    assert texts(take(hold, chunk("abc"))) == ["abc"]
    assert texts(take(hold, chunk(None, "stop"))) == [None]
    with pytest.raises(ValueError):
        HoldBack(-1)


def test_a_rewrite_of_the_held_text_lands_in_its_first_chunk_and_empties_the_others() -> None:
    hold = HoldBack(10)
    for c in (chunk("the"), chunk(" ban"), chunk("ned"), chunk(None, "stop")):
        assert take(hold, c) == []
    hold.replace("the [filtered]", chunk("x"))
    assert hold.text() == "the [filtered]"
    assert texts(hold.release()) == ["the "]  # the rewrite is longer than the window
    assert texts(hold.rest()) == ["[filtered]", None]


def test_a_rewrite_with_no_text_held_gets_its_own_chunk() -> None:
    hold = HoldBack(4)
    hold.replace("hi", chunk("x", "stop"))
    assert texts(hold.rest()) == ["hi"]


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


class PhraseFilter(Skill):
    """Rewrites the phrase to "[filtered]" in the held text once its last piece came."""

    name = "phrase-filter"

    def __init__(self) -> None:
        self.answers: list[str] = []

    @hook("on_chunk", hold_back=16)
    async def rewrite(self, data: HookData, ctx: Context) -> None:
        text = (data.held or "") + (data.content or "")
        if "top secret" in text:
            data.held = text.replace("top secret", "[filtered]")
            data.content = ""

    @hook("after_llm_call")
    async def answer(self, data: HookData, ctx: Context) -> None:
        assert data.response is not None
        self.answers.append(data.response.choices[0].message.content or "")


async def test_a_hook_rewrites_held_text_and_the_client_and_the_completion_get_the_rewrite() -> None:
    skill = PhraseFilter()
    agent = Agent("t", skills=[skill])
    received = [
        c.choices[0].delta.content or ""
        async for c in agent.run_stream("[[echo]] the plan is top secret and more")
        if c.choices
    ]
    assert "".join(received) == "the plan is [filtered] and more"
    assert skill.answers == ["the plan is [filtered] and more"]


def test_held_is_writable_at_on_chunk_only() -> None:
    data = HookData(lifecycle="on_chunk", held="abc")
    data.held = "[filtered]"
    with pytest.raises(AttributeError, match="a hook may change: chunk, content, held"):
        data.full_content = "x"
    with pytest.raises(AttributeError, match="read-only at on_message"):
        HookData(lifecycle="on_message").held = "x"
