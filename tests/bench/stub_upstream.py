"""The stub OpenAI-compatible upstream of the gateways bench: `python -m tests.bench.stub_upstream PORT`.

Both gateways (hookbus and Portkey) call the same stub, so what the stub costs is the same
on both sides and counted on neither (it runs in a process of its own, as a provider runs
elsewhere). Every answer is ANSWER_WORDS words, the first of which says whether the
request's messages still held the word the bench's hooks rewrite (`darn`): `seen` or
`clean`, so the load generator checks on every request that its hook ran, or that none
did. Streamed, one word a chunk, framed as OpenAI frames a stream (a role chunk, the
words, a finish chunk, the usage chunk when `stream_options.include_usage` asks for it,
`[DONE]`); not streamed, one completion with its usage. The bytes are built once per
marker, so the stub's own CPU stays small beside the gateways it feeds.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

ANSWER_WORDS = 20
REWRITTEN = "darn"
"""The word the bench's rewriting hooks replace in the request (with `***`)."""
_USAGE = {"prompt_tokens": 30, "completion_tokens": ANSWER_WORDS, "total_tokens": 30 + ANSWER_WORDS}


def marker(messages: list[dict[str, object]]) -> str:
    """`seen` when a message still holds the rewritten word, else `clean`."""
    return "seen" if any(REWRITTEN in str(m.get("content") or "") for m in messages) else "clean"


def words(mark: str) -> list[str]:
    return [mark, *(f"w{n}" for n in range(1, ANSWER_WORDS))]


@functools.lru_cache(maxsize=4)
def _completion(mark: str) -> bytes:
    body = {
        "id": "chatcmpl-stub", "object": "chat.completion", "created": 1, "model": "stub",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": " ".join(words(mark))},
                     "finish_reason": "stop"}],
        "usage": _USAGE,
    }
    return json.dumps(body, separators=(",", ":")).encode()


@functools.lru_cache(maxsize=8)
def _events(mark: str, usage: bool) -> tuple[bytes, ...]:
    base = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 1, "model": "stub"}

    def event(delta: dict[str, str], finish: str | None = None) -> bytes:
        body = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"

    items = [event({"role": "assistant", "content": ""})]
    items += [event({"content": (" " if n else "") + word}) for n, word in enumerate(words(mark))]
    items.append(event({}, "stop"))
    if usage:
        items.append(b"data: " + json.dumps({**base, "choices": [], "usage": _USAGE}, separators=(",", ":")).encode() + b"\n\n")
    return (*items, b"data: [DONE]\n\n")


async def completions(request: Request) -> Response:
    body = await request.json()
    mark = marker(body.get("messages") or [])
    if not body.get("stream"):
        return Response(_completion(mark), media_type="application/json")
    events = _events(mark, bool((body.get("stream_options") or {}).get("include_usage")))

    async def stream() -> AsyncIterator[bytes]:
        for item in events:
            yield item

    return StreamingResponse(stream(), media_type="text/event-stream")


async def models(_: Request) -> Response:
    return JSONResponse({"object": "list", "data": [{"id": "stub", "object": "model"}]})


app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"]), Route("/v1/models", models)])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
