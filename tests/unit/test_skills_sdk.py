"""The skills SDK as a skill author meets it: decorators, schemas, errors, data rules."""

from __future__ import annotations

import json
from enum import Enum
from typing import Optional

import pytest

from hookbus.skills import (
    LIFECYCLES,
    Context,
    HookData,
    HookError,
    Lifecycle,
    PaymentRequired,
    Skill,
    hook,
    tool,
)


def test_unknown_lifecycle_fails_when_the_class_is_defined_and_lists_valid_names():
    with pytest.raises(ValueError) as caught:

        class Broken(Skill):
            @hook("before_llm")
            async def nope(self, data, ctx):
                return data

    message = str(caught.value)
    assert "before_llm" in message
    for name in LIFECYCLES:
        assert name in message


class Unit(str, Enum):  # noqa: UP042 - the (str, Enum) form users write
    celsius = "celsius"
    fahrenheit = "fahrenheit"


class WeatherSkill(Skill):
    name = "weather"

    @tool
    async def forecast(
        self, city: str, days: int = 3, unit: Unit = Unit.celsius, tags: list[str] | None = None,
        hour: Optional[int] = None,  # noqa: UP045 - Optional spelled the old way on purpose
    ) -> str:
        """Forecast the weather for a city.

        Args:
            city: Name of the city.
            days: How many days ahead.
            unit: Temperature unit.
        """
        return f"{city}:{days}:{unit.value}"


def test_tool_schema_comes_from_signature_hints_defaults_and_docstring():
    (tool_descriptor,) = [t.descriptor for t in WeatherSkill().bound_tools()]
    schema = tool_descriptor.parameters_schema
    function = schema["function"]
    assert schema["type"] == "function"
    assert function["name"] == "forecast"
    assert function["description"] == "Forecast the weather for a city."
    params = function["parameters"]
    assert params["required"] == ["city"]
    props = params["properties"]
    assert props["city"] == {"description": "Name of the city.", "title": "City", "type": "string"}
    assert props["days"]["default"] == 3 and props["days"]["type"] == "integer"
    assert props["days"]["description"] == "How many days ahead."
    assert props["unit"]["default"] == "celsius"
    unit_schema = params["$defs"]["Unit"]
    assert unit_schema["enum"] == ["celsius", "fahrenheit"]
    assert {"type": "array", "items": {"type": "string"}} in props["tags"]["anyOf"]
    assert {"type": "null"} in props["hour"]["anyOf"]
    assert "ctx" not in props


def test_tool_name_scope_and_description_can_be_set():
    class Named(Skill):
        @tool(name="lookup", description="Look a thing up.", scope="admin")
        def find(self, key: str, ctx: Context) -> str:
            return key

    (descriptor,) = [t.descriptor for t in Named().bound_tools()]
    function = descriptor.parameters_schema["function"]
    assert (descriptor.name, function["description"], descriptor.scope) == ("lookup", "Look a thing up.", "admin")
    assert "ctx" not in function["parameters"]["properties"]
    assert Named().bound_tools()[0].wants_ctx is True


def test_skill_without_name_gets_one_from_its_class():
    class RequestCounter(Skill):
        pass

    assert RequestCounter.name == "request-counter"


def test_hooks_are_collected_in_definition_order_with_inherited_first():
    class Base(Skill):
        @hook("on_connection", 10)
        def first(self, data, ctx):
            return data

    class Child(Base):
        name = "child"

        @hook("on_message")
        def second(self, data, ctx):
            return data

    assert [h.descriptor.method for h in Child().bound_hooks()] == ["first", "second"]
    assert Child().bound_hooks()[0].key == "child.first"


def test_hook_data_refuses_a_field_that_is_read_only_at_that_point():
    data = HookData(lifecycle="on_chunk", content="hi")
    data.content = "HI"
    with pytest.raises(AttributeError, match="read-only at on_chunk; a hook may change: chunk, content"):
        data.messages = []
    final = HookData(lifecycle="finalize_connection")
    with pytest.raises(AttributeError, match="may change: nothing"):
        final.usage = None


def test_hook_data_round_trips_through_json_with_its_error():
    data = HookData(lifecycle="finalize_connection", messages=[], error=PaymentRequired("no credit"))
    again = HookData.model_validate_json(data.model_dump_json())
    assert isinstance(again.error, PaymentRequired)
    assert again.error.status_code == 402 and again.error.message == "no credit"


def test_hook_error_has_an_openai_style_body():
    error = HookError(429, "too_many", "slow down", {"retry_after": 3})
    body = error.to_openai_body()["error"]
    assert body == {
        "message": "slow down", "type": "rate_limit_error", "code": "too_many", "param": None,
        "details": {"retry_after": 3},
    }
    assert PaymentRequired().to_openai_body()["error"]["type"] == "payment_required"


def test_hook_rejects_a_non_positive_timeout():
    with pytest.raises(ValueError, match="timeout must be positive"):
        hook("on_message", timeout=0)


def test_one_descriptor_type_from_the_decorator_through_the_announcement_to_the_plan():
    from hookbus.bus.groups.registry import GroupAnnouncement
    from hookbus.services.orchestrator.loop.plan import HookPlan, PlannedHook, PlannedTool
    from hookbus.services.worker.host import GroupHost
    from hookbus.skills.descriptors import HookDescriptor, ToolDescriptor

    class Ledger(Skill):
        name = "ledger"

        @hook("on_connection", 7, scope="paid", timeout=2.0, critical=True)
        async def check(self, data, ctx):
            return None

        @tool(scope="paid")
        def balance(self, account: str) -> int:
            """Look up a balance."""
            return 1

    skill = Ledger()
    (bound,) = skill.bound_hooks()
    (bound_tool,) = skill.bound_tools()
    wire = GroupAnnouncement.model_validate_json(GroupHost("g", [skill]).announcement().model_dump_json())
    assert wire.hooks == [bound.descriptor] and type(wire.hooks[0]) is HookDescriptor
    assert wire.tools == [bound_tool.descriptor] and type(wire.tools[0]) is ToolDescriptor
    assert bound.descriptor == HookDescriptor(
        skill="ledger", method="check", lifecycle="on_connection", priority=7, scope="paid",
        timeout=2.0, critical=True,
    )
    plan = HookPlan.build([], [], [PlannedHook(h, "g") for h in wire.hooks], [PlannedTool(t, "g") for t in wire.tools])
    assert plan.by_lifecycle["on_connection"][0].descriptor is wire.hooks[0]
    assert plan.tool_schemas(["paid"]) == [bound_tool.descriptor.parameters_schema]


class Both(Skill):
    @hook("on_chunk", 20)
    def by_name(self, data, ctx):
        return None

    @hook(Lifecycle.ON_CHUNK, 20)
    def by_member(self, data, ctx):
        return None


def test_a_lifecycle_is_a_string_enum_and_the_wire_keeps_its_strings():
    by_name, by_member = [h.descriptor for h in Both().bound_hooks()]
    assert by_name.lifecycle is Lifecycle.ON_CHUNK and by_member.lifecycle is Lifecycle.ON_CHUNK
    assert by_name.model_dump(mode="json")["lifecycle"] == "on_chunk"
    data = HookData(lifecycle="on_chunk", content="x")
    assert data.lifecycle == "on_chunk" and {"on_chunk": 1}[data.lifecycle] == 1
    # the on_compaction fields stay off the wire at every other point
    assert json.loads(data.model_dump_json()) == {
        "lifecycle": "on_chunk", "messages": None, "stream": None, "tools": None,
        "model_settings": None, "iteration": None, "response": None, "usage": None,
        "chunk": None, "content": "x", "chunk_index": None, "full_content": None,
        "tool_call": None, "tool_id": None, "tool_skipped": False, "client_tool": False,
        "tool_result": None, "error": None,
    }
