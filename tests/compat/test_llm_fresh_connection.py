"""A call that lost its kept-alive connection is retried on a new one.

The endpoint double answers the first request of each connection (keep-alive) and, on the
next request of that connection, reads it and closes the socket without a word: what a
server does that closed an idle connection as the client reused it. Two calls made together
leave two such connections in the client's pool; a retry that took the pool's next
kept-alive connection failed as the first try did (`the LLM endpoint could not be
reached`), one 502 in about 18,000 requests under saturation. The real `openai` client
over real HTTP, on both of the adapter's HTTP stacks, streamed and not.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from hookbus.services.orchestrator.llm.client import LLM, HttpStack
from tests.compat.upstream import completion, text_stream
from tests.waiting import wait_for

MESSAGES = [{"role": "user", "content": "hello"}]


@dataclass
class Served:
    """One request the double read: on which connection (numbered from 1 as they opened),
    the how-many-th on it, and whether it was answered."""

    connection: int
    nth: int
    answered: bool


@dataclass
class StaleKeepAlive:
    """The double: each connection answers once, then drops its next request unanswered."""

    served: list[Served] = field(default_factory=list)
    connections: int = 0
    waiting_first: int = 0
    """How many first requests wait for `together` connections before they are answered."""
    together: int = 2

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        connection, nth = self.connections, 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                     if line.lower().startswith(b"content-length:")), 0,
                )
                body = json.loads(await reader.readexactly(length))
                nth += 1
                if nth > 1:  # a reused connection: read, then hang up without an answer
                    self.served.append(Served(connection, nth, answered=False))
                    return
                if connection <= self.together:  # the warm-up calls: keep them all open at once
                    self.waiting_first += 1
                    await wait_for(self._all_arrived, timeout=10, every=0.01)
                self.served.append(Served(connection, nth, answered=True))
                writer.write(_answer(bool(body.get("stream"))))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _all_arrived(self) -> bool:
        return self.waiting_first >= self.together


def _answer(stream: bool) -> bytes:
    if stream:
        events = [f"data: {json.dumps(c)}\n\n" for c in text_stream("fresh answer").chunks] + ["data: [DONE]\n\n"]
        body, kind = "".join(events).encode(), b"text/event-stream"
    else:
        body, kind = json.dumps(completion("fresh answer")).encode(), b"application/json"
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: " + kind + b"\r\nConnection: keep-alive\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


@pytest.fixture
async def double() -> AsyncIterator[tuple[StaleKeepAlive, str]]:
    stale = StaleKeepAlive()
    server = await asyncio.start_server(stale.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield stale, f"http://127.0.0.1:{port}/v1"


async def _text(llm: LLM, streamed: bool) -> str:
    if not streamed:
        answer = await llm.complete("m", MESSAGES, None)
        return answer.choices[0].message.content or ""
    parts = []
    async for chunk in llm.stream("m", MESSAGES, None):
        parts += [c.delta.content or "" for c in chunk.choices]
    return "".join(parts)


@pytest.mark.parametrize("streamed", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize("http", ["httpx", "aiohttp"])
async def test_a_call_on_a_connection_the_endpoint_closed_is_retried_on_a_new_one(
    double: tuple[StaleKeepAlive, str], http: HttpStack, streamed: bool
):
    stale, url = double
    llm = LLM(url, "sk-test", retries=1, http=http)
    try:
        warm = await asyncio.gather(_text(llm, streamed), _text(llm, streamed))
        assert warm == ["fresh answer", "fresh answer"]
        assert stale.connections == 2  # two kept-alive connections in the pool

        assert await _text(llm, streamed) == "fresh answer"

        first_try, retry = stale.served[2:]
        assert not first_try.answered and first_try.connection <= 2 and first_try.nth == 2
        assert retry.answered and retry.connection == 3 and retry.nth == 1  # a connection of its own
        # a later call: the shared pool's other connection is dropped too, and its retry again
        # opens one of its own (the retries' client keeps none alive)
        assert await _text(llm, streamed) == "fresh answer"
        later_try, later_retry = stale.served[4:]
        assert not later_try.answered and later_try.connection <= 2
        assert later_retry.answered and later_retry.connection == 4 and later_retry.nth == 1
    finally:
        await llm.aclose()
