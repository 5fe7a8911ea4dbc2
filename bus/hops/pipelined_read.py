"""A blocking read that rides in the pipeline of the writes it waits on.

A hop costs each side a write and a read: the worker replies, then reads the next hop;
the orchestrator sends a hop, then reads the replies. Sent apart, that is two socket
writes per hop on each side, and on this kind of machine a socket write to Redis costs
more CPU than the Python around it. A reader that just delivered what it read (so the
writes it causes are coming) offers its next read to the writer instead (`ride`): if the
writer flushes within `LINGER` seconds, the read goes at the end of that pipeline, one
write for both, blocking for at most `BLOCK_MS`; if not (a slow hook, an LLM call in
between), the offer is withdrawn and the reader reads alone, so nothing waits longer
than the linger for a read.

The price: the writes of a pipeline that carries a read are confirmed only when the
read returns (Redis answers a pipeline in order), at most `BLOCK_MS` later. The writers
that use this (hookbus.services.worker.replica.ReplyBatcher, hookbus.bus.connection.batched_appends) only
need the confirmation for what follows the write (an ack, an error to raise), not to
let the reader on the other end see it: Redis has stored it at once.

Not on a Redis Cluster: a cluster pipeline is split by node, and a blocking read in it
would hold back that node's part. A writer on a cluster client refuses every offer
(`RideSlot`), so its readers read alone there, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from hookbus.bus.connection.cluster import is_cluster_client

LINGER = 0.002
"""How long a reader waits for a flush to carry its read before it reads alone."""
BLOCK_MS = 50
"""The block of a read that rides: short, as the writes it rides with are confirmed only
when it returns."""


class RideOffer:
    """A read offered to a writer's next pipeline.

    The writer either takes it (`take`, while it builds a pipeline of its own writes),
    runs it and hands its result to `arrived`, or the reader withdraws it after the
    linger. `done` resolves, once a taken read returned and `deliver` handled its
    response, with whether there was anything in it; with None if withdrawn; or with
    the pipeline's error."""

    __slots__ = ("block_ms", "done", "taken", "_queue", "_deliver")

    def __init__(
        self, queue: Callable[[Any, int, int], None], deliver: Callable[[Any], bool], block_ms: int = BLOCK_MS
    ) -> None:
        """`queue(pipe, riding, block_ms)`: add the read, blocking `block_ms` at most, to
        `pipe`, which carries `riding` writes; `deliver(response)`: hand the read's
        response on, True if it held anything."""
        self.block_ms = block_ms
        self._queue, self._deliver = queue, deliver
        self.done: asyncio.Future[bool | None] = asyncio.get_running_loop().create_future()
        self.taken = False

    def open(self) -> bool:
        return not self.taken and not self.done.done()

    def take(self, pipe: Any, riding: int) -> None:
        self.taken = True
        self._queue(pipe, riding, self.block_ms)

    def arrived(self, response: Any) -> None:
        """The pipeline's result for the read: a response, or the error Redis gave."""
        if isinstance(response, Exception):
            self.failed(response)
            return
        delivered = self._deliver(response)
        if not self.done.done():
            self.done.set_result(delivered)

    def failed(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc if isinstance(exc, Exception) else ConnectionError(str(exc)))

    def withdraw(self) -> None:
        if self.open():
            self.done.set_result(None)


class Rider(Protocol):
    """A writer that can carry a read: `offer` keeps it for its next pipeline with
    writes (replacing an earlier offer)."""

    def offer(self, ride: RideOffer) -> None: ...


class RideSlot:
    """The one offer a writer holds, taken by the first pipeline with writes of its own;
    on a cluster client every offer is withdrawn at once."""

    __slots__ = ("_ride", "_refuse")

    def __init__(self, client: Any) -> None:
        self._ride: RideOffer | None = None
        self._refuse = is_cluster_client(client)

    def offer(self, ride: RideOffer) -> None:
        if self._refuse:
            ride.withdraw()
            return
        self._ride = ride

    def take(self) -> RideOffer | None:
        ride, self._ride = self._ride, None
        return ride if ride is not None and ride.open() else None


async def ride(rider: Rider, offer: RideOffer, linger: float = LINGER) -> bool | None:
    """Offer the read and wait: None if no flush took it within `linger` (read alone),
    else whether the read it rode with delivered anything; raises the pipeline's error."""
    rider.offer(offer)
    if offer.done.done():  # refused
        return offer.done.result()
    timer = asyncio.get_running_loop().call_later(linger, offer.withdraw)
    try:
        return await offer.done
    finally:
        timer.cancel()
