"""ContentFilter: masks banned words in user input and filters flagged words out of answers."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from hookbus.skills.builtin._common import as_list, env_list, logger, state_section
from hookbus.skills.context import Context
from hookbus.skills.data import HookData
from hookbus.skills.decorators import hook
from hookbus.skills.skill import Skill

STATE_KEY = "content_filter"
LOGGER_NAME = "hookbus.skills.content_filter"
DEFAULT_BANNED_WORDS = ("damn", "crap", "bastard")
_WORD_CHAR = re.compile(r"\w")


class ContentFilter(Skill):
    """Cleans what users send and what the model streams back.

    Input (`before_llm_call` priority 10, and `on_message` priority 10): every banned
    word in a `user` message is replaced by `mask`, whole words only, case-insensitively
    (`damn` and `DAMN` go, `damnation` stays). `before_llm_call` changes what the LLM
    gets; `on_message` changes the conversation the request ends with (what finalize
    hooks see and what is stored).

    Output, streamed (`on_chunk` priority 10): a flagged word in the streamed text is
    replaced by `replacement` before the client sees it. A word can arrive split over
    chunks (`" clas"` + `"sified"`, or the phrase `"top secret"` as `" top"` +
    `" secret"`), so with `hold_back=True` (the default) the filter holds back the tail of
    the text while it could still be the start of a flagged word: that chunk goes out with
    the text before it, and the held text goes out with a later chunk once it is known
    to be harmless, or as `replacement` once it completes a flagged word. Nothing flagged
    ever reaches the client; the cost is that a word which merely starts like a flagged
    one reaches the client one chunk late. Held text goes out at the latest with the chunk
    carrying the `finish_reason` (if an earlier hook drops that chunk, the held text
    is lost). State (held text, a little already-sent context) lives
    in `ctx.state["content_filter"]`, so consecutive chunks may run on different replicas.
    With `hold_back=False` nothing is held: the chunk that completes a flagged word has
    its part of the word replaced, but the pieces that came in earlier chunks have
    already gone out (the client sees e.g. `"clas[filtered]"`).

    Output, whole (`after_llm_call` priority 10): flagged words in the assistant message
    are replaced too, which covers non-streamed requests (the client gets the filtered
    answer) and keeps the conversation consistent with what a streaming client saw.

    Configuration:
        banned_words: words masked in user input; env `HOOKBUS_BANNED_WORDS` (comma
            separated), default `damn,crap,bastard`. An empty env var disables masking.
        flagged_words: words filtered out of model output; env `HOOKBUS_FLAGGED_WORDS`,
            default: the banned words. Entries may be phrases ("top secret").
        mask: what replaces a banned word in input (default `***`).
        replacement: what replaces a flagged word in output (default `[filtered]`).
        hold_back: hold back possible starts of flagged words in a stream (default True).
    """

    name = "content-filter"

    def __init__(
        self,
        *,
        banned_words: Iterable[str] | str | None = None,
        flagged_words: Iterable[str] | str | None = None,
        mask: str = "***",
        replacement: str = "[filtered]",
        hold_back: bool = True,
    ) -> None:
        banned = (
            env_list("HOOKBUS_BANNED_WORDS", DEFAULT_BANNED_WORDS)
            if banned_words is None
            else as_list(banned_words)
        )
        flagged = (
            env_list("HOOKBUS_FLAGGED_WORDS", banned)
            if flagged_words is None
            else as_list(flagged_words)
        )
        self.banned_words = tuple(banned)
        self.flagged_words = tuple(flagged)
        self.mask = mask
        self.replacement = replacement
        self.hold_back = hold_back
        self._banned = _pattern(banned)
        self._flagged = _pattern(flagged)
        self._flagged_lower = tuple(word.lower() for word in flagged)
        self._context_chars = max((len(word) for word in flagged), default=0) + 1

    # ------------------------------------------------------------------ input

    def clean(self, text: str) -> str:
        """`text` with every banned word replaced by the mask."""
        if self._banned is None or not text:
            return text
        return self._banned.sub(self.mask, text)

    def filter_output(self, text: str) -> str:
        """`text` with every flagged word replaced by the replacement."""
        if self._flagged is None or not text:
            return text
        return self._flagged.sub(self.replacement, text)

    def _clean_messages(self, messages: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        """A new list with user messages cleaned, or None when nothing changed."""
        if not messages or self._banned is None:
            return None
        changed = False
        cleaned: list[dict[str, Any]] = []
        for message in messages:
            new = message
            if isinstance(message, dict) and message.get("role") == "user":
                content = _map_text(message.get("content"), self.clean)
                if content != message.get("content"):
                    new = {**message, "content": content}
                    changed = True
            cleaned.append(new)
        return cleaned if changed else None

    @hook("before_llm_call", 10)
    async def clean_input(self, data: HookData, ctx: Context) -> HookData | None:
        cleaned = self._clean_messages(data.messages)
        if cleaned is None:
            return None
        data.messages = cleaned
        logger(LOGGER_NAME, ctx).info("user_input_masked", lifecycle=data.lifecycle)
        return data

    @hook("on_message", 10)
    async def clean_conversation(self, data: HookData, ctx: Context) -> HookData | None:
        cleaned = self._clean_messages(data.messages)
        if cleaned is None:
            return None
        data.messages = cleaned
        return data

    # ----------------------------------------------------------------- output

    @hook("after_llm_call", 10)
    async def filter_response(self, data: HookData, ctx: Context) -> HookData | None:
        response = data.response
        if self._flagged is None or response is None or not response.choices:
            return None
        content = response.choices[0].message.content
        filtered = self.filter_output(content or "")
        if not content or filtered == content:
            return None
        response = response.model_copy(deep=True)
        response.choices[0].message.content = filtered
        data.response = response
        logger(LOGGER_NAME, ctx).info("output_filtered", lifecycle=data.lifecycle)
        return data

    @hook("on_chunk", 10)
    async def filter_chunk(self, data: HookData, ctx: Context) -> HookData | None:
        chunk = data.chunk
        if self._flagged is None or chunk is None or not chunk.choices:
            return None  # dropped by an earlier hook, or the usage-only chunk
        state = state_section(ctx, STATE_KEY)
        if not data.full_content:
            state["held"], state["sent"] = "", ""  # a new LLM call starts
        held, sent = str(state.get("held", "")), str(state.get("sent", ""))
        content = data.content or ""
        text = held + content
        final = chunk.choices[0].finish_reason is not None
        if not text:
            if final:
                state["held"], state["sent"] = "", ""
            return None
        keep = 0 if final or not self.hold_back else self._hold_length(sent, text)
        release, held = text[: len(text) - keep], text[len(text) - keep :]
        out = self._filter_release(sent, release, held)
        state["held"] = "" if final else held
        state["sent"] = "" if final else (sent + release)[-self._context_chars :]
        if out == content:
            return None
        if out != release:
            logger(LOGGER_NAME, ctx).info("chunk_filtered", chunk_index=data.chunk_index)
        data.content = out
        return data

    def _hold_length(self, sent: str, text: str) -> int:
        """How many chars at the end of `text` could still start a flagged word."""
        best = 0
        for word in self._flagged_lower:
            for k in range(min(len(word), len(text)), best, -1):
                start = len(text) - k
                if text[start:].lower() != word[:k]:
                    continue
                before = text[start - 1] if start else sent[-1:]
                if not before or not _WORD_CHAR.match(before):
                    best = k
                    break
        return best

    def _filter_release(self, sent: str, release: str, held: str) -> str:
        """`release` with every flagged match that overlaps it replaced.

        The scan sees the already-sent context before it and the held text after it, so
        word boundaries are judged on the real text.
        """
        assert self._flagged is not None
        scan = sent + release + held
        low, high = len(sent), len(sent) + len(release)
        parts: list[str] = []
        position = low
        for match in self._flagged.finditer(scan):
            start, end = max(match.start(), low), min(match.end(), high)
            if start >= end:
                continue
            parts.append(scan[position:start])
            parts.append(self.replacement)
            position = end
        parts.append(scan[position:high])
        return "".join(parts)


def _pattern(words: Iterable[str]) -> re.Pattern[str] | None:
    """Whole-word, case-insensitive alternation of `words` (longest first), or None."""
    unique = sorted({word for word in words if word}, key=len, reverse=True)
    if not unique:
        return None
    alternation = "|".join(re.escape(word) for word in unique)
    return re.compile(rf"(?<!\w)(?:{alternation})(?!\w)", re.IGNORECASE)


def _map_text(content: Any, fn: Any) -> Any:
    """Apply `fn` to a message's text: a string, or the text parts of a parts list."""
    if isinstance(content, str):
        return fn(content)
    if isinstance(content, list):
        parts = []
        for part in content:
            if (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                part = {**part, "text": fn(part["text"])}
            parts.append(part)
        return parts
    return content
