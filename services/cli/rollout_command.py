"""`hookbus rollout`: send a share of a worker group's new requests to a canary version,
then promote it or roll it back.

    hookbus rollout --group guard --canary v2 --share 0.1   # 10% of new requests to v2
    hookbus rollout --group guard --canary v2 --share 0.5   # ramp up
    hookbus rollout --group guard --end                     # every new request to the newest version

The share is stored in Redis (hookbus.bus.groups.versions.Rollout) and read by every
orchestrator with its registry refresh (within half a second). Only new requests are
affected: a request keeps the version it was pinned to. Promote: end the rollout once
the old version's replicas are replaced (the newest version then takes every new
request). Roll back: `--share 0` (no new request goes to the canary), stop the canary's
replicas (they drain: the requests pinned to it finish on it), then `--end`. Without a
rollout the newest version takes every new request, so ending it while the canary still
runs sends everything to the canary.

A typo must not pass for a rollout: the group must be one the registry knows, and the
canary a version one of its live replicas announces (the version rule is the spec's:
hookbus.bus.groups.versions.check_version), unless `--force` says the canary's replicas
are about to start.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable

from hookbus.bus.settings import get_settings


def add_rollout_parser(commands: argparse._SubParsersAction, redis_url: Callable[[], str]) -> None:
    """`redis_url()`: the bus's URL, as the other commands find it (or exit)."""
    rollout = commands.add_parser("rollout", help="send a share of a group's new requests to a canary version")
    rollout.add_argument("--group", required=True)
    rollout.add_argument("--canary", default=None, help="the version that gets the share")
    rollout.add_argument("--share", type=float, default=0.1, help="fraction of new requests, 0..1 (default 0.1)")
    rollout.add_argument("--end", action="store_true", help="end the rollout (promote, or before a roll back)")
    rollout.add_argument(
        "--force", action="store_true",
        help="store it even if the group is unknown or no live replica announces the canary version",
    )
    rollout.set_defaults(func=lambda args: cmd_rollout(args, redis_url()))


def cmd_rollout(args: argparse.Namespace, redis_url: str) -> int:
    from hookbus.bus.connection.cluster import keys_for
    from hookbus.bus.connection.retrying import connect
    from hookbus.bus.connection.values import text
    from hookbus.bus.groups.registry import REPLICA_TTL
    from hookbus.bus.groups.versions import Rollout, check_version, live_versions, set_rollout

    if args.end == (args.canary is not None):
        raise SystemExit("hookbus rollout: give --canary VERSION [--share S], or --end")
    rollout = None
    if args.canary is not None:
        try:
            rollout = Rollout(canary=check_version(args.canary), share=args.share)
        except ValueError as exc:
            raise SystemExit(f"hookbus rollout: {exc}") from exc

    async def store() -> str | None:
        """Why not (the group or the version unknown), else None once stored."""
        client = connect(redis_url)
        keys = keys_for(redis_url, get_settings().prefix)
        try:
            if not args.force:
                if not await client.hexists(keys.registry, args.group):
                    known = sorted(text(g) for g in await client.hkeys(keys.registry))
                    return f"no group {args.group!r} is registered (groups: {', '.join(known) or 'none'})"
                live = await live_versions(client, keys, args.group, alive_within=REPLICA_TTL)
                if rollout is not None and rollout.canary not in live:
                    return (
                        f"no live replica of {args.group!r} runs version {rollout.canary!r} (live: "
                        f"{', '.join(live) or 'none'}); start its replicas first, or give --force"
                    )
            await set_rollout(client, keys, args.group, rollout)
            return None
        finally:
            await client.aclose()

    refused = asyncio.run(store())
    if refused is not None:
        raise SystemExit(f"hookbus rollout: {refused}")
    print(
        f"{args.group}: {rollout.share:.0%} of new requests to {rollout.canary}" if rollout
        else f"{args.group}: rollout ended; new requests go to the newest version"
    )
    return 0
