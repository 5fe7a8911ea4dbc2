"""The OpenAI `model` field to an agent: a served agent by name (or `<agent>/<model>`),
the gateway's own model names while at most one agent is served, a 404 at once for a
name nobody serves, a 503 for an agent whose orchestrators are gone, and a 403 that does
not say whether an agent exists for a key limited to others."""

from __future__ import annotations

import pytest

from hookbus.bus.groups.served_agents import (
    AgentCard,
    ServedAgents,
    ServedAgentsRecord,
    check_agent_name,
    parse_served,
)
from hookbus.bus.keys import Keys
from hookbus.services.gateway.agent_routes import Route, listed, route
from hookbus.services.gateway.errors import GatewayError

NOW = 1_000_000.0
CONFIGURED = ["offline"]


def served(**agents: tuple[list[str], bool]) -> ServedAgents:
    """Agents by name -> (the models each allows, whether its one orchestrator lives)."""
    beats = [(f"orch-{name}", NOW if alive else NOW - 60) for name, (_, alive) in agents.items()]
    records = {
        f"orch-{name}": ServedAgentsRecord(agents=[AgentCard(name=name, models=models)]).model_dump_json()
        for name, (models, _) in agents.items()
    }
    return parse_served(beats, records, NOW)  # type: ignore[arg-type]


TWO = served(support=(["gpt-small"], True), billing=([], True))


def refused(model: str, view: ServedAgents, allowed: frozenset[str] | None = None) -> tuple[int, str]:
    with pytest.raises(GatewayError) as caught:
        route(model, view, CONFIGURED, allowed)
    return caught.value.status_code, caught.value.code


def test_each_agent_has_its_own_requests_stream() -> None:
    keys = Keys("hookbus:")
    assert keys.requests_for("chatcmpl-1", "support") == "hookbus:requests:support"
    assert keys.requests_for("chatcmpl-1") == "hookbus:requests"
    tagged = Keys("hookbus:", shards=4, cluster=True)
    shard = tagged.requests_for("chatcmpl-1")
    # one slot for a request's journal and its agent's stream shard: the tag comes before the name
    assert tagged.requests_for("chatcmpl-1", "support") == shard + ":support"
    assert len(tagged.agent_request_streams("support")) == 4


def test_an_agent_is_picked_by_name_or_with_a_model_it_allows() -> None:
    assert route("support", TWO, CONFIGURED, None) == Route("support")
    assert route("support/gpt-small", TWO, CONFIGURED, None) == Route("support", "gpt-small")
    assert refused("billing/gpt-small", TWO) == (404, "model_not_found")
    assert refused("offline", TWO) == (404, "model_not_found")  # two agents: the name must pick one
    assert refused("nobody", TWO) == (404, "model_not_found")


def test_one_agent_served_keeps_the_gateways_own_model_names() -> None:
    one = served(support=([], True))
    assert route("offline", one, CONFIGURED, None) == Route(None)
    assert route("support", one, CONFIGURED, None) == Route("support")
    assert refused("gpt-nope", one) == (404, "model_not_found")
    assert route("offline", ServedAgents(), CONFIGURED, None) == Route(None)
    assert listed(one, CONFIGURED, None) == CONFIGURED


def test_an_agent_whose_orchestrators_are_gone_is_a_503_not_a_wait() -> None:
    view = served(support=([], True), billing=([], False))
    assert refused("billing", view) == (503, "agent_unavailable")
    assert view.live == ["support"]
    assert route("offline", view, CONFIGURED, None) == Route(None)  # one agent served now


def test_a_key_limited_to_one_agent_gets_the_same_403_for_any_other_name() -> None:
    only_billing = frozenset({"billing"})
    assert route("billing", TWO, CONFIGURED, only_billing) == Route("billing")
    assert refused("support", TWO, only_billing) == refused("no-such-agent", TWO, only_billing) == (403, "model_not_allowed")
    assert refused("support/gpt-small", TWO, only_billing) == (403, "model_not_allowed")
    assert listed(TWO, CONFIGURED, only_billing) == ["billing"]
    assert listed(TWO, CONFIGURED, None) == ["billing", "support", "support/gpt-small"]
    one = served(support=([], True))
    assert refused("offline", one, only_billing) == (403, "model_not_allowed")
    assert listed(one, CONFIGURED, only_billing) == []


def test_records_of_two_orchestrators_merge_and_a_bad_record_is_skipped() -> None:
    beats = [("a", NOW), ("b", NOW), ("c", NOW)]
    records = {
        "a": ServedAgentsRecord(agents=[AgentCard(name="support", models=["m1"])]).model_dump_json(),
        "b": ServedAgentsRecord(agents=[AgentCard(name="support", models=["m2"]), AgentCard(name="billing")]).model_dump_json(),
        "c": "not json",
    }
    view = parse_served(beats, records, NOW)  # type: ignore[arg-type]
    assert view.agents["support"].orchestrators == ("a", "b")
    assert view.agents["support"].card.models == ["m1", "m2"]
    assert view.live == ["billing", "support"]


def test_agent_names_are_key_segments() -> None:
    assert check_agent_name("support-2.eu") == "support-2.eu"
    for bad in ("", "a/b", "a:b", "{x}", "has space", "x" * 65):
        with pytest.raises(ValueError):
            check_agent_name(bad)
