"""What an endpoint says of a model: its context window and how its tokenizer counts.

Asked once per process and endpoint (`learn`), and only when compaction needs the answer;
every probe is a plain HTTP request the endpoint may not know (then it says nothing).
"""

from __future__ import annotations

from typing import Any

import httpx
import structlog
from pydantic import BaseModel

from hookbus.services.orchestrator.compaction.token_scale import SAMPLE_TEXT
from hookbus.services.orchestrator.compaction.tokens import count_text

log = structlog.get_logger("hookbus.llm")

PROBE_TIMEOUT = 5.0
"""Seconds to wait for an endpoint to say its context window."""


class EndpointFacts(BaseModel):
    """What an endpoint said of one model: its window, and its tokenizer's count of
    SAMPLE_TEXT against ours (theirs, ours); None where it did not say."""

    window: int | None = None
    tokenizer: tuple[int, int] | None = None


_LEARNED: dict[tuple[str, str], EndpointFacts | None] = {}
"""Per (base url, model), what `LLM.learn_model` found; None while the one probe runs."""



async def learn(base_url: str, api_key: str, model: str, *, window: bool, known: bool) -> EndpointFacts | None:
    """What the endpoint at `base_url` said of `model` (asked on the first call only; None
    while another caller's probe runs). `known`: nothing to ask (the offline model, or a
    model tiktoken knows), the table and a scale of 1.0 hold."""
    key = (base_url, model)
    if key in _LEARNED:
        return _LEARNED[key]
    if known:
        facts = _LEARNED[key] = EndpointFacts()
        return facts
    _LEARNED[key] = None  # taken: no second probe while this one runs
    try:
        facts = _LEARNED[key] = await _ask_endpoint(base_url, api_key, model, window)
    except BaseException:  # cancelled with its request: the next one asks
        del _LEARNED[key]
        raise
    return facts


async def _ask_endpoint(base_url: str, api_key: str, model: str, window: bool) -> EndpointFacts:
    headers = {"Authorization": f"Bearer {api_key}"}
    root = base_url.rstrip("/").removesuffix("/v1")
    facts = EndpointFacts()
    try:
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT, headers=headers) as http:
            if window:
                facts.window = await _served_window(http, root, base_url, model)
            facts.tokenizer = await _tokenizer_counts(http, root, model)
    except Exception:  # noqa: BLE001 - the table and the margin apply when it cannot tell
        log.warning("endpoint_probe_failed", model=model, exc_info=True)
    log.info("endpoint_probed", model=model, window=facts.window, tokenizer=facts.tokenizer)
    return facts


async def _served_window(http: httpx.AsyncClient, root: str, base_url: str, model: str) -> int | None:
    """llama.cpp's `GET /props` (`n_ctx`), vLLM's `GET /v1/models` (`max_model_len`)."""
    n_ctx = _n_ctx(await _get_json(http, f"{root}/props"))
    if n_ctx:
        return n_ctx
    models = await _get_json(http, f"{base_url.rstrip('/')}/models")
    for card in (models or {}).get("data") or ():
        if isinstance(card, dict) and card.get("id") == model and isinstance(card.get("max_model_len"), int):
            return int(card["max_model_len"])
    return None


async def _tokenizer_counts(http: httpx.AsyncClient, root: str, model: str) -> tuple[int, int] | None:
    """The endpoint's count of SAMPLE_TEXT and ours: llama-cpp-python's `POST /extras/tokenize`,
    llama.cpp's and vLLM's `POST /tokenize`, the first that answers."""
    attempts = (
        (f"{root}/extras/tokenize", {"input": SAMPLE_TEXT, "model": model}),  # llama-cpp-python
        (f"{root}/tokenize", {"content": SAMPLE_TEXT}),  # llama.cpp
        (f"{root}/tokenize", {"model": model, "prompt": SAMPLE_TEXT}),  # vLLM
    )
    for url, body in attempts:
        theirs = _token_count(await _post_json(http, url, body))
        if theirs:
            return theirs, count_text(SAMPLE_TEXT)
    return None


async def _get_json(http: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
    try:
        response = await http.get(url)
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None


async def _post_json(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any] | None:
    try:
        response = await http.post(url, json=body)
        answer = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


def _token_count(answer: dict[str, Any] | None) -> int | None:
    """A tokenize endpoint's count: `count` (vLLM, llama-cpp-python's /count) or its tokens."""
    if not answer:
        return None
    if isinstance(answer.get("count"), int):
        return int(answer["count"])
    tokens = answer.get("tokens")
    return len(tokens) if isinstance(tokens, list) and tokens else None


def _n_ctx(props: dict[str, Any] | None) -> int | None:
    """llama.cpp's served context size from its /props (newer servers nest it)."""
    if not props:
        return None
    for holder in (props.get("default_generation_settings") or {}, props):
        value = holder.get("n_ctx") if isinstance(holder, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None
