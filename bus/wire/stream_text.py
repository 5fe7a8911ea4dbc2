"""The model's text of one streamed LLM call, kept once on each side of a batched on_chunk hop.

An on_chunk hook may read `full_content`, the model's text so far. Carrying that text on
every hop made a long answer cost its square (each hop carried everything before it), so
from protocol 1.1 a batched hop carries only its new chunks and names the stream they
belong to (`ChunkText`); each side keeps the text where it is used:

- the orchestrator keeps it as the chunks come (`StreamText`), and joins it only when
  something asks for a chunk's text so far: an in-process hook, an observer, a worker
  that lacks it;
- a worker replica keeps each stream's text as its hops come (`KeptTexts`). A stream's
  hops may land on different replicas: from their replies the orchestrator knows which
  chunk each replica's text reaches, and a hop carries the text any live replica lacks
  (`ChunkText.gap`: nothing when the group has one replica; the previous batch's text when
  two take turns; the whole text so far while a live replica has not answered the stream
  yet). A replica may still lack it (it restarted, forgot, or the registry did not list
  it yet): it runs no hook and answers `needs_text`, and the orchestrator sends the batch
  again with the whole text so far, which any replica can run (and keeps, for the
  stream's next hops).
"""

from __future__ import annotations

import collections
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import BaseModel, Field

TEXT_KEPT_PROTOCOL = (1, 1)
"""The first protocol version whose workers keep a stream's text (`ChunkText`)."""


class ChunkText(BaseModel):
    """Which stream a batched on_chunk hop's chunks come from (protocol 1.1): the worker keeps
    the text so far per stream instead of the hop carrying it. `gap`: the text of the
    stream's chunks from `gap_from` up to the batch's first, for a replica whose kept text
    ends there (the orchestrator knows what each replica answered); from `start`, the whole
    text so far, which every replica can use."""

    stream: str = Field(min_length=1, max_length=64, description="The id of the LLM call's stream, unique per call.")
    start: int = Field(ge=0, description="The chunk_index of the stream's first chunk (its text so far starts there).")
    gap_from: int | None = Field(
        default=None, ge=0, description="The chunk_index of `gap`'s first piece (absent: no gap)."
    )
    gap: list[str] | None = Field(
        default=None,
        description="The content of each of the stream's chunks from `gap_from` up to (not including) the batch's "
        "first chunk, one string per chunk.",
    )


class StreamText:
    """The orchestrator's copy of one call's text: each chunk's text as it came, joined once
    when asked (and that join kept, so a later ask joins only what came since); and which
    chunk each replica's kept text reaches, from its replies."""

    def __init__(self, start: int) -> None:
        self.ref = ChunkText(stream=secrets.token_hex(8), start=start)
        self._parts: list[str] = []
        self._ends: list[int] = []
        """Characters of the text through each chunk."""
        self._joined = ""
        self._joined_parts = 0
        self._reached: dict[str, int] = {}
        """Per replica, the chunk_index its kept text reaches (the next one it can extend with)."""

    def add(self, content: str) -> int:
        """A chunk's text; how many chunks the text so far holds with it."""
        self._parts.append(content)
        self._ends.append((self._ends[-1] if self._ends else 0) + len(content))
        return len(self._parts)

    def upto(self, count: int) -> str:
        """The text of the first `count` chunks (a value `add` returned)."""
        end = self._ends[count - 1] if count else 0
        if end > len(self._joined):
            self._joined = "".join([self._joined, *self._parts[self._joined_parts :]])
            self._joined_parts = len(self._parts)
        return self._joined if end == len(self._joined) else self._joined[:end]

    def ref_for(self, first_index: int, live: Iterable[str], *, whole: bool = False) -> ChunkText:
        """What a batch whose first chunk is `first_index` names: with a gap from the
        oldest point any of the `live` replicas reaches (the start for one that has not
        answered the stream yet, or lacked its text: so it learns the text from whichever
        hop it gets next), none when each reaches the batch; or (`whole`) from the start."""
        start = self.ref.start
        gap_from = start if whole else min((self._reached.get(r, start) for r in live), default=first_index)
        if gap_from >= first_index:
            return self.ref
        begin, stop = gap_from - self.ref.start, first_index - self.ref.start
        return self.ref.model_copy(update={"gap_from": gap_from, "gap": self._parts[begin:stop]})

    def answered(self, replica: str, next_index: int | None) -> None:
        """A replica ran the stream's chunks before `next_index`, or (None) lacked its text."""
        if next_index is None:
            self._reached.pop(replica, None)
        else:
            self._reached[replica] = next_index


@dataclass(slots=True)
class _Kept:
    text: str
    next_index: int
    used: float


MAX_KEPT_CHARS = 64 * 1024 * 1024
"""Characters of stream text one worker replica keeps at most (the least recently used
stream is forgotten first; its next hop asks for the text again)."""
KEPT_IDLE = 300.0
"""Seconds after its last hop that a stream's text is forgotten (its call is long over)."""


class KeptTexts:
    """A worker replica's texts of the streams its hops came from (see the module docstring)."""

    def __init__(self, max_chars: int = MAX_KEPT_CHARS, idle: float = KEPT_IDLE) -> None:
        self._streams: collections.OrderedDict[str, _Kept] = collections.OrderedDict()
        self._chars = 0
        self._max_chars = max_chars
        self._idle = idle

    def take(self, ref: ChunkText, first_index: int) -> str | None:
        """The text before a batch's first chunk, taken out of the store while the batch
        runs (so that appending to it is in place); None when this replica lacks it."""
        kept = self._streams.pop(ref.stream, None)
        if kept is not None:
            self._chars -= len(kept.text)
        if first_index == ref.start:
            return ""
        if kept is not None and kept.next_index == first_index:
            return kept.text
        if ref.gap is None or ref.gap_from is None:
            return None
        if ref.gap_from == ref.start:
            return "".join(ref.gap)
        if kept is not None and ref.gap_from <= kept.next_index <= first_index:
            return "".join([kept.text, *ref.gap[kept.next_index - ref.gap_from :]])
        return None

    def keep(self, ref: ChunkText, text: str, next_index: int) -> None:
        """The stream's text through the chunk before `next_index`, for its next hop."""
        now = time.monotonic()
        self._streams[ref.stream] = _Kept(text, next_index, now)
        self._chars += len(text)
        while self._streams and (
            self._chars > self._max_chars or next(iter(self._streams.values())).used < now - self._idle
        ):
            _, dropped = self._streams.popitem(last=False)
            self._chars -= len(dropped.text)

    def __len__(self) -> int:
        return len(self._streams)
