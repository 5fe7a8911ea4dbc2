"""WorkerReplica with one change: the FastStream handler gets the raw message without
`msg: RedisStreamMessage` (an `Annotated[..., Context("message")]`).

Why: fast_depends 3.0.x resolves a `Context(...)` parameter through `CustomField.use`,
a plain (sync) function, and `run_async` sends every sync callable to a worker thread
(`anyio.to_thread.run_sync`): one thread-pool round trip per hop, plus GIL hand-offs.
Here a pass-through decoder hands the StreamMessage itself over as the message body and
the handler takes `msg: Any`, so nothing is injected and nothing leaves the event loop.
FastStream still runs the subscriber loop, middlewares, AsyncAPI.

    python -m tests.bench.experiments.faststream_fix --group G pkg.mod:Skill [--concurrency N]
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from faststream.middlewares import AckPolicy
from faststream.redis import StreamSub

from hookbus.bus.deadletter import entry_id_text
from hookbus.services.worker.replica import WorkerReplica


async def _the_message(msg: Any) -> Any:
    """Decoder: the StreamMessage is the body (no JSON round trip of the entry)."""
    return msg


class NoThreadReplica(WorkerReplica):
    """FastStream's subscriber dispatch instead of WorkerReplica's own read loop (which
    replaced it after this experiment), with the handler free of Context injection."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._subscribe()

    async def _read_loop(self) -> None:
        return None  # FastStream's subscriber consumes the stream instead

    def _subscribe(self) -> None:
        @self.broker.subscriber(
            stream=StreamSub(
                self.stream,
                group=self.group,
                consumer=self.replica,
                max_records=self.concurrency,
                polling_interval=1000,
                last_id=">",
            ),
            ack_policy=AckPolicy.MANUAL,
            max_workers=self.concurrency,
            decoder=_the_message,
            title=f"hooks:{self.group}",
        )
        async def on_hop(msg: Any) -> None:
            raw = msg.raw_message
            await self.process(entry_id_text(raw["message_ids"][0]), raw["data"], attempt=1)


def main() -> None:
    from hookbus.bus.settings import get_settings
    from hookbus.services.logs import configure_logging
    from hookbus.services.specs import load_skill
    from hookbus.services.worker.host import GroupHost

    parser = argparse.ArgumentParser()
    parser.add_argument("--group", required=True)
    parser.add_argument("skills", nargs="+")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    configure_logging()
    settings = get_settings()
    replica = NoThreadReplica(
        GroupHost(args.group, [load_skill(s) for s in args.skills]), settings.redis_url or "",
        prefix=settings.prefix, concurrency=args.concurrency,
    )
    asyncio.run(replica.app.run())


if __name__ == "__main__":
    main()
