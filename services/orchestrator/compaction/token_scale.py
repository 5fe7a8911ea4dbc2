"""How many of the model's own tokens one of hookbus's tokens is, per model.

hookbus counts with tiktoken's cl100k (hookbus.services.orchestrator.compaction.tokens): exact enough
for OpenAI's models, but a local model's tokenizer can count far more for the same text
(Gemma 3 counted 1.56x on one conversation with tools offered), so a conversation hookbus
thought fit a 2048-token window did not, the summary request was refused, and compaction fell
back to dropping the conversation. Compaction therefore budgets against the window divided by
this scale, so every threshold and the summary request's own bound hold in the model's tokens.

The scale of a model comes from, in order:
- what the endpoint reported for earlier calls: `usage.prompt_tokens` against hookbus's
  count of the same messages and tools offered (the chat template's own tokens stay in the
  scale). The largest of the recent reports wins: over-counting compacts a turn early,
  under-counting loses the conversation;
- the endpoint's tokenizer, asked once (llama.cpp's `POST /tokenize`, llama-cpp-python's
  `POST /extras/tokenize`, vLLM's `POST /tokenize`) on a sample text;
- 1.0 for a model tiktoken knows (OpenAI's) and the offline model, else
  UNKNOWN_MODEL_MARGIN.
"""

from __future__ import annotations

from collections import deque

import tiktoken

UNKNOWN_MODEL_MARGIN = 1.35
"""The scale of a model nothing has measured yet: Gemma 3's tokenizer counted 1.30x cl100k on
the sample below and llama.cpp's prompts added its chat template on top."""
RECENT_REPORTS = 8
MIN_COUNTED = 64
"""A report on fewer of our tokens than this says more about the template than the tokenizer."""
SCALE_BOUNDS = (0.5, 4.0)
"""Reports outside these are taken for a broken usage figure, not a tokenizer."""

SAMPLE_TEXT = (
    "The quarterly report was shared on 2026-03-14 at 09:30 UTC. Revenue grew 12.5% to "
    "$4.2M, while costs fell by one third. Next steps: review the budget, email the "
    "team (ops@example.com), and run `make deploy --env=prod` before Friday. Questions? "
    "Ask Zoë or François; they'll answer in English, Deutsch or Español."
)
"""What the tokenize probe measures: prose with numbers, punctuation, code and names."""


def tiktoken_knows(model: str) -> bool:
    try:
        tiktoken.encoding_name_for_model(model.rsplit("/", 1)[-1])
    except KeyError:
        return False
    return True


class TokenScale:
    """The scale of each model one LLM endpoint serves; updated as calls report usage."""

    def __init__(self, *, exact: bool = False) -> None:
        """`exact`: the endpoint counts with hookbus's tokenizer (the offline model)."""
        self.exact = exact
        self._reports: dict[str, deque[float]] = {}
        self._probed: dict[str, float] = {}

    def of(self, model: str) -> float:
        if self.exact:
            return 1.0
        reports = self._reports.get(model)
        if reports:
            return max(reports)
        if model in self._probed:
            return self._probed[model]
        return 1.0 if tiktoken_knows(model) else UNKNOWN_MODEL_MARGIN

    def report(self, model: str, prompt_tokens: int, counted: int) -> None:
        """An endpoint's `usage.prompt_tokens` for messages hookbus counted as `counted`."""
        if counted < MIN_COUNTED or prompt_tokens <= 0:
            return
        scale = prompt_tokens / counted
        if SCALE_BOUNDS[0] <= scale <= SCALE_BOUNDS[1]:
            self._reports.setdefault(model, deque(maxlen=RECENT_REPORTS)).append(scale)

    def probed(self, model: str, theirs: int, ours: int) -> None:
        """The endpoint's tokenizer counted `theirs` tokens where hookbus counted `ours`."""
        if ours > 0 and theirs > 0:
            self._probed[model] = min(max(theirs / ours, SCALE_BOUNDS[0]), SCALE_BOUNDS[1])

    def knows(self, model: str) -> bool:
        return model in self._reports or model in self._probed
