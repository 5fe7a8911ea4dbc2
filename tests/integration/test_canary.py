"""A canary rollout: `hookbus rollout` sends a share of a group's new requests to the canary
version, `--share 0` none (a roll back), `--end` all to the newest version (a promotion).
Which version each request ran on is read from its journal's pin."""

from __future__ import annotations

import asyncio
import os
import sys

from hookbus import Agent
from hookbus.bus.groups.registry import REFRESH_EVERY
from hookbus.bus.groups.versions import Rollout, set_rollout
from hookbus.services.worker.host import GroupHost
from hookbus.services.worker.replica import WorkerReplica
from hookbus.skills import Context, HookData, Skill, hook
from tests.integration.processes import REPO
from tests.integration.stack import running_stack


class Stamp(Skill):
    name = "stamp"

    @hook("on_connection", 10)
    async def stamp(self, data: HookData, ctx: Context) -> None:
        return None


async def hookbus_rollout(redis_url: str, prefix: str, *args: str, group: str = "stamp") -> tuple[int, str]:
    """`hookbus rollout --group GROUP ARGS`: its exit status and what it wrote to stderr."""
    env = dict(os.environ, REDIS_URL=redis_url, HOOKBUS_PREFIX=prefix)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hookbus.services.cli.main", "rollout", "--group", group, *args, env=env, cwd=REPO,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 60)
    return await process.wait(), err.decode()


async def test_a_canary_gets_its_share_then_none_then_every_new_request(redis_url, prefix):
    async with running_stack(redis_url, prefix, Agent("canary"), {"stamp": [Stamp()]}) as (client, _, [stable]):
        canary = WorkerReplica(GroupHost("stamp", [Stamp()]), redis_url, prefix=prefix, replica="canary-0", version="c1")
        await set_rollout(client.redis, client.keys, "stamp", Rollout(canary="c1", share=0.0))  # before it starts
        await canary.start()
        try:

            async def versions_of(count: int) -> dict[str, int]:
                await asyncio.sleep(REFRESH_EVERY + 0.3)  # every orchestrator read the rollout
                answers = await asyncio.gather(*(client.complete(f"[[echo]] r{n}") for n in range(count)))
                counted: dict[str, int] = {}
                for answer in answers:
                    pin = (await client.redis.hget(client.keys.journal(answer.id), "pin:stamp")).decode()
                    counted[pin] = counted.get(pin, 0) + 1
                return counted

            assert await versions_of(10) == {stable.version: 10}  # share 0: the canary started idle
            assert (await hookbus_rollout(redis_url, prefix, "--canary", "c1", "--share", "0.5"))[0] == 0
            half = await versions_of(40)
            assert 8 <= half.get("c1", 0) <= 32 and half["c1"] + half[stable.version] == 40, half
            assert (await hookbus_rollout(redis_url, prefix, "--end"))[0] == 0
            assert await versions_of(10) == {"c1": 10}  # promoted: the newest version takes all
        finally:
            await canary.stop()


async def test_a_rollout_names_a_registered_group_and_a_version_a_live_replica_runs(redis_url, prefix):
    """A typo is refused, not stored: an unknown group, a version no live replica announces
    (unless --force: its replicas are about to start), a version the spec's rule refuses
    (a trailing newline would never match a replica's version)."""
    async with running_stack(redis_url, prefix, Agent("canary"), {"stamp": [Stamp()]}) as (client, _, [stable]):
        status, err = await hookbus_rollout(redis_url, prefix, "--canary", "9.9", "--share", "0.5", group="shuot")
        assert status != 0 and "no group 'shuot'" in err and "stamp" in err, err
        status, err = await hookbus_rollout(redis_url, prefix, "--canary", "9.9", "--share", "0.5")
        assert status != 0 and "no live replica" in err and stable.version in err, err
        status, err = await hookbus_rollout(redis_url, prefix, "--canary", "v2\n", "--force")
        assert status != 0 and "1-64 letters" in err, err
        assert not await client.redis.exists(client.keys.rollout("stamp")) and not await client.redis.exists(client.keys.rollout("shuot"))
        status, err = await hookbus_rollout(redis_url, prefix, "--canary", "9.9", "--share", "0.5", "--force")
        assert status == 0, err
        assert await client.redis.hget(client.keys.rollout("stamp"), "canary") == b"9.9"
        assert (await hookbus_rollout(redis_url, prefix, "--canary", stable.version, "--share", "0.2"))[0] == 0
