"""TurnStream: what of the agent's rounds a streaming client sees (one turn)."""

from __future__ import annotations

from typing import Any

from openai.types.chat import ChatCompletionChunk

from hookbus.services.orchestrator.streaming.turn_stream import TurnStream


def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate(
        {
            "id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }
    )


def test_a_plain_text_chunk_goes_out_as_it_is_without_a_copy():
    turn = TurnStream("c", "m")
    text = chunk({"content": "hello"})
    assert turn.visible(text) is text
    assert turn.visible(chunk({"content": ""})) is None


def test_the_role_goes_out_once_and_the_rounds_tool_calls_and_finishes_never():
    turn = TurnStream("c", "m")
    first = turn.visible(chunk({"role": "assistant", "content": ""}))
    assert first is not None and first.choices[0].delta.role == "assistant"
    again = turn.visible(chunk({"role": "assistant", "content": "next round"}))
    assert again is not None and again.choices[0].delta.role is None and again.choices[0].delta.content == "next round"
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    assert turn.visible(chunk({"tool_calls": [call]})) is None
    finished = chunk({"content": "done"}, "tool_calls")
    shown = turn.visible(finished)
    assert shown is not None and shown.choices[0].finish_reason is None and shown.choices[0].delta.content == "done"
    assert finished.choices[0].finish_reason == "tool_calls"  # the agent's own chunk is left whole


def test_a_chunk_with_text_and_a_tool_call_shows_the_text_only():
    turn = TurnStream("c", "m")
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": ""}}
    mixed = chunk({"content": "let me look", "tool_calls": [call]})
    shown = turn.visible(mixed)
    assert shown is not None and shown.choices[0].delta.tool_calls is None
    assert shown.choices[0].delta.content == "let me look"
    assert mixed.choices[0].delta.tool_calls is not None
