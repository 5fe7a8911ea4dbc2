"""A stub OpenAI-compatible model that streams a long answer in large chunks, for the long
streams bench: `python -m tests.bench.long_model PORT`.

The user message `[[long:BYTES:CHUNK]]` gets an answer of BYTES characters (ASCII letters
and blanks, each chunk different) streamed CHUNK characters a chunk, as OpenAI frames a
stream (a role chunk, the text, a finish chunk, `[DONE]`). The offline model streams one
word a chunk and caps an answer at 100,000 words; a long answer through it would measure
the per-chunk costs, not what carrying the text costs. The chunks are built once per size
and kept, so the stub's own CPU stays small beside the services it feeds.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

DIRECTIVE = re.compile(r"\[\[long:(\d+):(\d+)\]\]")


def prompt(size: int, chunk: int) -> str:
    """The user message that asks for an answer of `size` characters in `chunk`-character chunks."""
    return f"[[long:{size}:{chunk}]]"


@functools.lru_cache(maxsize=8)
def _events(size: int, chunk: int) -> tuple[bytes, ...]:
    """Every SSE event of the answer, encoded."""
    base = {"id": "chatcmpl-long", "object": "chat.completion.chunk", "created": 1, "model": "long"}

    def event(delta: dict[str, str], finish: str | None = None) -> bytes:
        body = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"

    pieces = []
    for n, at in enumerate(range(0, size, chunk)):
        word = f"{n:07d} " + "abcdefghijklmnopqrstuvwxyz "[n % 26] * 9 + " "
        piece = (word * (chunk // len(word) + 1))[: min(chunk, size - at)]
        pieces.append(event({"content": piece}))
    return (event({"role": "assistant", "content": ""}), *pieces, event({}, "stop"), b"data: [DONE]\n\n")


async def completions(request: Request) -> Response:
    body = await request.json()
    text = " ".join(str(m.get("content") or "") for m in body.get("messages", []) if m.get("role") == "user")
    found = DIRECTIVE.search(text)
    if found is None:
        return JSONResponse({"error": {"message": "ask for [[long:BYTES:CHUNK]]"}}, status_code=400)
    events = _events(int(found.group(1)), int(found.group(2)))

    async def stream() -> AsyncIterator[bytes]:
        for item in events:
            yield item

    return StreamingResponse(stream(), media_type="text/event-stream")


async def models(_: Request) -> Response:
    return JSONResponse({"object": "list", "data": [{"id": "long", "object": "model"}]})


app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"]), Route("/v1/models", models)])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
