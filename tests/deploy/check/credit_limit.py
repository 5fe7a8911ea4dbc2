"""CreditLimit: a stand-in billing hook that answers callers without credit with a 402.

`make deploy-check` hosts it in a worker group of its own, so that a 402 raised on a worker
replica is shown crossing the bus, the orchestrator and the gateway to an openai client.
A real billing skill would ask a ledger; this one reads a fixed list of peers.
"""

from __future__ import annotations

from collections.abc import Iterable

from hookbus.skills import Context, HookData, PaymentRequired, Skill, hook
from hookbus.skills.builtin._common import as_list, env_list

NO_CREDIT_ENV = "HOOKBUS_NO_CREDIT_PEERS"


class CreditLimit(Skill):
    """Refuses, before anything else runs, every request whose caller has no credit left.

    Configuration:
        no_credit: the `peer_user_id`s (from the gateway's API keys) refused with a 402;
            env `HOOKBUS_NO_CREDIT_PEERS` (comma separated), default none.
    """

    name = "credit-limit"

    def __init__(self, *, no_credit: Iterable[str] | str | None = None) -> None:
        peers = env_list(NO_CREDIT_ENV, ()) if no_credit is None else as_list(no_credit)
        self.no_credit = frozenset(peers)

    @hook("on_connection", 1)
    async def check_credit(self, data: HookData, ctx: Context) -> None:
        peer = ctx.auth.peer_user_id
        if peer is not None and peer in self.no_credit:
            raise PaymentRequired(f"{peer} has no credit left", {"peer_user_id": peer})
