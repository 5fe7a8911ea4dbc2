"""A connection flood from one address: the gateway bounds the connections one client
address holds (`max_connections_per_address`), and answers that refuse (401, 429, 503)
close their connection, so another caller is served through the flood."""

from __future__ import annotations

import asyncio
import socket
import uuid

import httpx

from hookbus import Agent
from hookbus.services.gateway.edge_options import EdgeOptions
from tests.gateway.server import running_gateway
from tests.integration.stack import running_stack

KEY = "sk-flood"
PER_ADDRESS = 20
FLOOD = 300
"""Connections the flooder opens (from 127.0.0.1) and never sends on: more than the
gateway's whole `max_connections` of this test."""
EDGE = EdgeOptions(max_connections=200, max_connections_per_address=PER_ADDRESS, header_timeout=30)


def one_request(port: int, headers: bytes) -> tuple[bytes, bytes]:
    """A keep-alive GET on a fresh connection: (the answer's head, what came after it
    before the server closed or 1 s passed)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + b"\r\n")
        sock.settimeout(1.0)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            return received, b"still open"
        return received, b"closed"


async def test_a_refused_answer_closes_its_connection(redis_url):
    prefix = f"flood{uuid.uuid4().hex[:6]}:"
    async with running_stack(redis_url, prefix, Agent("flood")), running_gateway(
        redis_url, prefix, api_keys={KEY: {"peer_user_id": "alice"}}, models=["offline"]
    ) as gw:
        port = int(gw.url.rsplit(":", 1)[1])
        refused, refused_end = await asyncio.to_thread(one_request, port, b"Authorization: Bearer sk-wrong\r\n")
        served, served_end = await asyncio.to_thread(one_request, port, b"Authorization: Bearer " + KEY.encode() + b"\r\n")
    assert refused.startswith(b"HTTP/1.1 401") and b"connection: close" in refused.lower()
    assert refused_end == b"closed"
    assert served.startswith(b"HTTP/1.1 200") and served_end == b"still open"  # keep-alive as before


async def test_a_second_caller_is_served_through_a_flood_from_one_address(redis_url):
    prefix = f"flood{uuid.uuid4().hex[:6]}:"
    async with running_stack(redis_url, prefix, Agent("flood")), running_gateway(
        redis_url, prefix, api_keys={KEY: {"peer_user_id": "alice"}}, models=["offline"], edge=EDGE
    ) as gw:
        port = int(gw.url.rsplit(":", 1)[1])
        flood = [socket.create_connection(("127.0.0.1", port)) for _ in range(FLOOD)]
        try:
            await asyncio.sleep(0.5)  # the gateway accepted what it would
            other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")  # another client address
            headers = {"Authorization": f"Bearer {KEY}", "Connection": "close"}  # a fresh connection each time
            answers: list[int] = []
            async with httpx.AsyncClient(transport=other, timeout=10, headers=headers) as http:
                for _ in range(50):
                    answers.append((await http.get(f"{gw.v1}/models")).status_code)
            kept = sum(1 for sock in flood if _held(sock))
        finally:
            for sock in flood:
                sock.close()
    served = answers.count(200) / len(answers)
    assert served >= 0.99, answers
    assert kept <= PER_ADDRESS, kept
    print(f"connection flood: {FLOOD} connections from one address, {kept} kept open; "
          f"the other caller served {served:.0%} of {len(answers)}")


def _held(sock: socket.socket) -> bool:
    """Whether the server holds this connection: nothing came on it (a refused one got its
    503, or its end)."""
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False
