"""The hop path's pipeline: queued stream commands in one socket write on one pooled
connection, their replies read back in order, each command's error its own.

redis-py's `Pipeline` does the same, with more around it: its retry wrapper, its
observability calls, and on the way out the connection goes back to the pool through a
shielded task of its own (a task and three more event-loop turns). The hop path's
writers (hookbus.bus.connection.batched_appends on the orchestrator, the worker's ReplyBatcher) flush once
a hop each at low load, so that was paid on both sides of every hop: an XADD + XACK
flush takes 72-92 us of CPU through redis-py's pipeline and 60-68 us here (the hop
bench's "one flush" row; tests/bench/RESULTS.md, "Why the hop path is built as it is").

No retries here: a connection failure raises to the writer, which already handles it
(the appender's callers hear of it, the worker replies alone with backoff). The
connection is dropped then, and after a cancellation, so no reply left unread is served
to its next user. On a Redis Cluster a pipeline's commands go to several nodes: there
`execute` uses redis-py's cluster pipeline, as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

import redis.asyncio as aredis
from redis.asyncio.connection import Connection
from redis.commands.core import StreamCommands
from redis.exceptions import ResponseError

from hookbus.bus.connection.cluster import is_cluster_client

Queued = tuple[tuple[Any, ...], dict[str, Any]]


class Commands(StreamCommands):
    """Stream commands queued, not run: redis-py's own builders (`xadd`, `xack`,
    `xread`, `xreadgroup`, ...) make their arguments, so they go out and are parsed back
    exactly as through a redis-py pipeline."""

    _is_async_client: Literal[False] = False
    """For redis-py's typing: a builder here returns nothing to await."""
    _event_dispatcher: Any = None
    """Part of redis-py's commands protocol; the stream builders do not use it."""

    def __init__(self) -> None:
        self.queued: list[Queued] = []

    def execute_command(self, *args: Any, **options: Any) -> None:
        self.queued.append((args, options))


async def execute(client: aredis.Redis, commands: Commands) -> list[Any]:
    """Each command's parsed reply, or the ResponseError Redis gave it (like a redis-py
    pipeline's `execute(raise_on_error=False)`); a connection error raises."""
    if is_cluster_client(client):
        async with client.pipeline(transaction=False) as pipe:
            for args, options in commands.queued:
                pipe.execute_command(*args, **options)
            return list(await pipe.execute(raise_on_error=False))
    pool = client.connection_pool
    # redis-py's deprecation decorator hides the method's signature; this names it
    get_connection: Callable[[], Awaitable[Connection]] = pool.get_connection
    connection = await get_connection()
    try:
        await connection.send_packed_command(connection.pack_commands([args for args, _ in commands.queued]))
        results: list[Any] = []
        for args, options in commands.queued:
            try:
                results.append(await client.parse_response(connection, args[0], **options))
            except ResponseError as exc:
                results.append(exc)
        return results
    except BaseException:
        await connection.disconnect(nowait=True)
        raise
    finally:
        await pool.release(connection)
