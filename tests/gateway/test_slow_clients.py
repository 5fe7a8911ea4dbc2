"""Slow and many clients against a real `hookbus gateway` process: header and body timeouts,
the connection bound, and running out of file descriptors (hookbus.services.gateway.connections)."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx
import pytest

from tests.waiting import wait_for

pytestmark = pytest.mark.slow

@dataclass
class GatewayProcess:
    port: int
    proc: asyncio.subprocess.Process
    stderr: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def gateway_process(
    env: dict[str, str], *args: str, preexec: Callable[[], None] | None = None
) -> AsyncIterator[GatewayProcess]:
    port = free_port()
    with tempfile.TemporaryFile(mode="w+") as log:  # a file, not a pipe: a flood must not block it
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hookbus.services.cli.main", "gateway", "--port", str(port), *args,
            env=env, stdout=subprocess.DEVNULL, stderr=log, preexec_fn=preexec,
        )
        running = GatewayProcess(port, proc)

        async def up() -> bool:
            try:
                async with httpx.AsyncClient(timeout=2) as http:
                    return (await http.get(f"{running.url}/healthz")).status_code in (200, 503)
            except httpx.TransportError:
                return proc.returncode is not None

        try:
            assert await wait_for(up, timeout=30) and proc.returncode is None, "the gateway did not start"
            yield running
        finally:
            proc.terminate()
            try:
                async with asyncio.timeout(30):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
            log.seek(0)
            running.stderr = log.read()


async def open_raw(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def read_until_closed(reader: asyncio.StreamReader, timeout: float) -> bytes:
    async with asyncio.timeout(timeout):
        return await reader.read()


@pytest.fixture
async def strict(service_env) -> AsyncIterator[GatewayProcess]:
    async with gateway_process(service_env, "--header-timeout", "1", "--body-timeout", "1") as gw:
        yield gw


async def test_a_slowloris_client_is_cut_off_at_the_header_timeout_while_others_are_served(strict):
    drippers = []
    for _ in range(20):
        reader, writer = await open_raw(strict.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        drippers.append((reader, writer))

    async def drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[float, bytes]:
        started = time.perf_counter()
        answer = asyncio.create_task(read_until_closed(reader, timeout=15))
        with contextlib.suppress(ConnectionError):
            while not answer.done():  # the point: one header byte every 0.2 s, it never completes
                writer.write(b"X")
                await writer.drain()
                await asyncio.sleep(0.2)
        response = await answer
        writer.close()
        return time.perf_counter() - started, response

    dripping = asyncio.gather(*(drip(r, w) for r, w in drippers))
    async with httpx.AsyncClient(base_url=strict.url, timeout=30) as http:
        started = time.perf_counter()
        served = await http.get("/v1/models")
        other_caller = time.perf_counter() - started
    results = await dripping
    assert served.status_code == 200, served.text
    assert other_caller < 5.0, other_caller
    print(f"\nanother caller served in {other_caller:.3f} s while 20 clients dripped headers")
    for seconds, response in results:
        assert response.startswith(b"HTTP/1.1 408 "), response
        assert b'"code":"request_timeout"' in response
        assert 0.8 < seconds < 6.0, seconds


async def read_response(reader: asyncio.StreamReader) -> bytes:
    """One whole response with a content-length, as it came."""
    async with asyncio.timeout(10):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
        return head + await reader.readexactly(length)


async def test_the_header_timer_restarts_after_each_response_on_a_kept_alive_connection(strict):
    """Two pipelined requests are both answered (the second's headers came before the first
    response ended, so no timer runs for it); the third, dripped on the same connection
    after them, is cut off at the header timeout."""
    reader, writer = await open_raw(strict.port)
    request = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    writer.write(request * 2)
    for _ in range(2):
        assert (await read_response(reader)).startswith(b"HTTP/1.1 200 ")
    started = time.perf_counter()
    writer.write(b"GET /v1/models HTTP/1.1\r\n")
    answer = asyncio.create_task(read_until_closed(reader, timeout=15))
    with contextlib.suppress(ConnectionError):
        while not answer.done():
            writer.write(b"X")
            await writer.drain()
            await asyncio.sleep(0.2)
    response = await answer
    writer.close()
    assert response.startswith(b"HTTP/1.1 408 "), response
    assert 0.8 < time.perf_counter() - started < 6.0


async def test_a_body_that_does_not_arrive_in_time_gets_408(strict):
    reader, writer = await open_raw(strict.port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n{\"model\": "
    )
    await writer.drain()
    started = time.perf_counter()
    response = await read_until_closed(reader, timeout=15)
    writer.close()
    assert response.startswith(b"HTTP/1.1 408 "), response
    assert b'"code":"request_timeout"' in response
    assert time.perf_counter() - started < 6.0


async def test_connections_beyond_max_connections_get_503_until_some_close(service_env):
    async with gateway_process(service_env, "--max-connections", "3", "--header-timeout", "30") as gw:
        idle = [await open_raw(gw.port) for _ in range(3)]
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            async def refused() -> bool:
                return (await http.get("/v1/models")).status_code == 503

            assert await wait_for(refused, timeout=10)
            for _, writer in idle:
                writer.close()

            async def served() -> bool:
                return (await http.get("/v1/models")).status_code == 200

            assert await wait_for(served, timeout=10)


def low_descriptor_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (96, 96))


async def test_running_out_of_file_descriptors_logs_a_line_per_episode_not_a_traceback_per_accept(service_env):
    sockets: list[socket.socket] = []
    async with gateway_process(
        service_env, "--header-timeout", "30", "--max-connections", "10000", preexec=low_descriptor_limit
    ) as gw:
        for _ in range(200):  # far more than the gateway's 96 descriptors
            s = socket.socket()
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(("127.0.0.1", gw.port))
            sockets.append(s)
        await asyncio.sleep(4)  # the point: 4 s of failing accepts must log one line, not one per accept
        for s in sockets:
            s.close()

        async def served() -> bool:
            try:
                async with httpx.AsyncClient(base_url=gw.url, timeout=5) as http:
                    return (await http.get("/v1/models")).status_code == 200
            except httpx.TransportError:
                return False

        assert await wait_for(served, timeout=20), "the gateway did not recover"
    lines = gw.stderr.splitlines()
    print(f"\n{len(lines)} log lines, {gw.stderr.count('Traceback')} tracebacks")
    accept_lines = [line for line in lines if "accept" in line]
    assert "Traceback" not in gw.stderr, gw.stderr[-3000:]
    assert any("gateway_accept_failing" in line for line in accept_lines), accept_lines
    assert len(accept_lines) <= 4, accept_lines
    assert len(lines) < 40, lines[-40:]
