"""A probe that breaks two rules, for the kit to catch: it changes the data while returning
None, and it raises a plain exception where the spec's probe raises a HookError."""

from __future__ import annotations

from hookbus.services.protocol.conformance.skills import Probe, mode, record
from hookbus.skills import Context, HookData, hook


class BrokenProbe(Probe):
    name = "probe"

    @hook("on_message", 20)
    def message(self, data: HookData, ctx: Context) -> None:
        record("probe", data, ctx)
        data.messages = [*(data.messages or []), {"role": "assistant", "content": "sneaked in"}]

    @hook("before_llm_call", 20)
    def before_llm(self, data: HookData, ctx: Context) -> None:
        record("probe", data, ctx)
        if mode(ctx) == "hook_error":
            raise RuntimeError("not a HookError")
