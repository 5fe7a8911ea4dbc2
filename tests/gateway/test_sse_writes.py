"""SSE frames that are ready together leave as one body message (one socket write)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from hookbus.services.gateway.sse import MAX_READY_FRAMES, DisconnectWatcher, SSEResponse


async def _never_disconnects() -> dict[str, Any]:
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


async def _serve(frames: AsyncIterator[bytes], send_delay: float = 0.0) -> list[bytes]:
    bodies: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            bodies.append(message["body"])
            await asyncio.sleep(send_delay)

    async def gone(reason: str) -> None:
        raise AssertionError(f"the stream ended early: {reason}")

    response = SSEResponse(frames, DisconnectWatcher(_never_disconnects), gone)
    await response({"type": "http"}, _never_disconnects, send)
    return bodies


async def test_frames_of_one_read_go_in_one_write_and_later_ones_in_the_next():
    later = asyncio.Event()

    async def frames() -> AsyncIterator[bytes]:
        for n in range(5):  # one read of the response stream: no wait between them
            yield f"data: {n}\n\n".encode()
        await later.wait()
        yield b"data: 5\n\n"
        yield b"data: [DONE]\n\n"

    asyncio.get_running_loop().call_later(0.05, later.set)
    bodies = await _serve(frames())
    assert bodies == [b"".join(f"data: {n}\n\n".encode() for n in range(5)), b"data: 5\n\ndata: [DONE]\n\n", b""]


async def test_a_slow_client_holds_the_reading_back():
    read = 0

    async def frames() -> AsyncIterator[bytes]:
        nonlocal read
        for n in range(3 * MAX_READY_FRAMES):
            read += 1
            yield b"x"
            if n % 10 == 0:
                await asyncio.sleep(0)

    task = asyncio.ensure_future(_serve(frames(), send_delay=0.05))
    await asyncio.sleep(0.02)  # the first body is being sent, slowly
    assert read <= 2 * MAX_READY_FRAMES  # not everything was read ahead of it
    bodies = await task
    assert b"".join(bodies) == b"x" * (3 * MAX_READY_FRAMES)
