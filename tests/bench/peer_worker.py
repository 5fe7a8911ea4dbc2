"""The FastStream side of the peer bench: three no-op "hooks" as three plain FastStream
subscribers, the idiomatic way (`async def hook(body: dict) -> dict`, the return value is
the reply to `broker.request()`), each on its own stream in a consumer group with up to
32 messages in flight.

    python -m tests.bench.peer_worker REDIS_URL PREFIX
"""

from __future__ import annotations

import sys
from typing import Any

from faststream import FastStream
from faststream.redis import RedisBroker, StreamSub

from hookbus.services.process import event_loop

HOOKS = 3


def build(redis_url: str, prefix: str) -> FastStream:
    broker = RedisBroker(redis_url)
    for n in range(1, HOOKS + 1):

        @broker.subscriber(
            stream=StreamSub(f"{prefix}peer:{n}", group="peer", consumer=f"peer-{n}", max_records=32),
            max_workers=32,
        )
        async def hook(body: dict[str, Any]) -> dict[str, Any]:
            return body  # a no-op hook: the data goes back unchanged

    return FastStream(broker)


if __name__ == "__main__":
    event_loop.run(build(sys.argv[1], sys.argv[2]).run())  # the loop hookbus's services get
