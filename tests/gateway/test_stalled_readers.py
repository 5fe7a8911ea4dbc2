"""A client that stops reading a streamed answer: after `stall_timeout` with a write
waiting, the gateway ends the response, its run is cancelled and finalized once with the
code `client_stalled`, the key's slot is free again and the response stream is gone. A
key's `max_parallel_requests` bounds its stuck streams at every moment."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from typing import Any

import httpx
import pytest
import redis.asyncio as aredis

from hookbus import Agent
from tests.finals import Finals
from tests.gateway.server import running_gateway
from tests.integration.stack import running_stack
from tests.waiting import wait_for

KEY = "sk-stalls"
STALL = 1.0
LONG_ANSWER = "[[words:100000]]"
"""An answer of 100,000 chunks (about 15 MB of SSE): still running while
the client stalls, and far more than the socket buffers hold."""


def stalled_stream(port: int) -> tuple[socket.socket, str]:
    """A streamed request on a socket with a small receive buffer, read up to its headers
    and then never again: (the socket, the completion id)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    body = httpx.Request("POST", "http://x", json={
        "model": "offline", "stream": True, "messages": [{"role": "user", "content": LONG_ANSWER}],
    }).read()
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    fields = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if ": " in line)
    return sock, {k.lower(): v for k, v in fields.items()}["x-hookbus-completion-id"]


def read_to_the_end(sock: socket.socket) -> int:
    """Bytes left on the connection until the server closed it (it must, within 10 s)."""
    sock.settimeout(10)
    total = 0
    while chunk := sock.recv(65536):
        total += len(chunk)
    sock.close()
    return total


@pytest.mark.slow  # 13-25 s on 2 busy cores: the model's 100,000 chunks fill the buffers first
async def test_a_client_that_stops_reading_is_cut_off_its_run_finalized_and_its_slot_freed(redis_url):
    prefix = f"stall{uuid.uuid4().hex[:6]}:"
    finals = Finals()
    keys_file: dict[str, Any] = {KEY: {"peer_user_id": "alice", "max_parallel_requests": 2}}
    async with running_stack(redis_url, prefix, Agent("stalls", skills=[finals])) as (client, _, _), running_gateway(
        redis_url, prefix, api_keys=keys_file, models=["offline"], stall_timeout=STALL, send_buffer=16384
    ) as gw:
        port = int(gw.url.rsplit(":", 1)[1])
        started = time.monotonic()
        stuck = [await asyncio.to_thread(stalled_stream, port) for _ in range(2)]
        cids = [cid for _, cid in stuck]

        async def both_finalized() -> bool:
            return all(finals.runs[cid] for cid in cids)

        assert await wait_for(both_finalized, timeout=20), dict(finals.runs)
        ended_after = time.monotonic() - started
        async with httpx.AsyncClient(base_url=gw.v1, headers={"Authorization": f"Bearer {KEY}"}, timeout=20) as http:
            third = await http.post("/chat/completions", json={
                "model": "offline", "messages": [{"role": "user", "content": "[[echo]] my turn"}],
            })
        left = await asyncio.gather(*(asyncio.to_thread(read_to_the_end, sock) for sock, _ in stuck))
        redis = aredis.Redis.from_url(redis_url)
        stream_sizes = [await redis.xlen(client.keys.responses(cid)) for cid in cids]
        await redis.aclose()
        await asyncio.sleep(0.5)  # room for a second finalize, if there were one
    assert {cid: finals.codes[cid] for cid in cids} == {cid: "client_stalled" for cid in cids}
    assert all(finals.runs[cid] == 1 for cid in cids)
    assert third.status_code == 200, third.text  # the key's two slots were free again
    assert all(size <= 1 for size in stream_sizes), stream_sizes  # at most the run's terminal item
    assert all(n < 5_000_000 for n in left), left  # the connection ended, not the 15 MB answer
    print(f"stalled readers: finalized {ended_after:.1f} s after they started; "
          f"{[round(n / 1000) for n in left]} kB left to read on their connections")
