"""A failed hook's changes to `ctx.state` are undone exactly, whatever the state holds: the
runner's cheap copy of JSON-like state (skills/runner.py copy_state) must give what
copy.deepcopy gives, and hand anything else to deepcopy."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from hookbus.skills import Context, HookData, Skill, hook
from hookbus.skills.runner import copy_state, run_hooks

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=20,
)


def _containers(value: Any) -> list[int]:
    """The ids of every dict and list inside `value`, itself included."""
    if isinstance(value, dict):
        return [id(value)] + [i for item in value.values() for i in _containers(item)]
    if isinstance(value, list):
        return [id(value)] + [i for item in value for i in _containers(item)]
    return []


@given(st.dictionaries(st.text(max_size=6), json_values, max_size=6))
def test_json_state_is_copied_equal_and_shares_no_container_with_the_original(state):
    copied = copy_state(state)
    assert copied == copy.deepcopy(state)
    assert not set(_containers(copied)) & set(_containers(state))


class Marker:
    """Not JSON: the plain copy must leave it to deepcopy."""

    def __init__(self, items: list[int]) -> None:
        self.items = items


class Breaker(Skill):
    """Mutates the state in place, deep down, then fails."""

    name = "breaker"

    @hook("on_chunk")
    async def mutate_then_fail(self, data: HookData, ctx: Context) -> None:
        ctx.state["nested"]["list"][0]["n"] = 99
        ctx.state["nested"]["list"].append("more")
        ctx.state["new"] = True
        del ctx.state["gone"]
        if "marker" in ctx.state:
            ctx.state["shared_a"].append(2)
            ctx.state["marker"].items.append(2)
            ctx.state["tuple"][1].append(2)
        raise RuntimeError("after the mutations")


class Reader(Skill):
    """Runs after the failure: records what the state looked like then."""

    name = "reader"
    seen: dict[str, Any] = {}

    @hook("on_chunk", 60)
    async def read(self, data: HookData, ctx: Context) -> None:
        Reader.seen = ctx.state


async def _after_failure(state: dict[str, Any]) -> dict[str, Any]:
    hooks = [*Breaker().bound_hooks(), *Reader().bound_hooks()]
    result = await run_hooks(hooks, HookData(lifecycle="on_chunk", content="c"), Context(state=state))
    assert [o.outcome for o in result.outcomes] == ["failed", "ok"]
    return Reader.seen


async def test_a_failed_hook_leaves_json_state_exactly_as_it_found_it():
    seen = await _after_failure({"nested": {"list": [{"n": 1}], "x": 1.5}, "gone": None, "flag": False})
    assert seen == {"nested": {"list": [{"n": 1}], "x": 1.5}, "gone": None, "flag": False}


async def test_a_failed_hook_leaves_any_state_exactly_as_it_found_it():
    shared = [1]
    seen = await _after_failure({
        "nested": {"list": [{"n": 1}]}, "gone": None,
        "shared_a": shared, "shared_b": shared,  # one list reached twice
        "marker": Marker([1]), "tuple": (1, [1]),
    })
    assert seen["nested"] == {"list": [{"n": 1}]} and "new" not in seen and "gone" in seen
    assert seen["shared_a"] == [1] and seen["shared_a"] is seen["shared_b"]  # sharing kept, as deepcopy keeps it
    assert seen["marker"].items == [1] and seen["tuple"] == (1, [1])


def test_state_that_is_not_plain_json_is_copied_by_deepcopy():
    shared = [1]
    for state in ({"t": (1, [2])}, {(1, 2): "tuple key"}, {"s": {1, 2}}, {"sub": _Dict(a=[1])}):
        copied = copy_state(state)
        assert copied == copy.deepcopy(state) and type(copied[next(iter(state))]) is type(state[next(iter(state))])
        assert not set(_containers(copied)) & set(_containers(state))
    marked = copy_state({"m": Marker([1])})["m"]
    assert isinstance(marked, Marker) and marked.items == [1]
    copied = copy_state({"a": shared, "b": shared})
    assert copied["a"] is copied["b"] and copied["a"] is not shared


class _Dict(dict[str, Any]):
    """A dict subclass: the plain copy would turn it into a dict."""
