"""The observations of one request for one worker group: one entry on `observe:{group}`.

An observer group gets a request's stages in one entry, written when the request is
over (after finalize_connection's stage), in the order the stages ended. One entry per
request and group is what keeps a request's observations in order whatever the number
of replicas: a consumer group hands each entry to one replica, which runs its stages
one after another. It is also what makes them cheap: one XADD per request and group,
sent with the orchestrator's other appends of that event-loop turn, never waited for.

The entry's field `e` is an ObservationBatch envelope. Each stage's data was dumped to
JSON when the stage ended (the objects change afterwards), so the envelope is written by
joining those dumps (`BatchWriter`), never dumped twice, and read back with the model.
Two things keep it small:

- `state` is null (left out, its default) when the request's `ctx.state` is the same as
  at the stage before;
- an on_chunk stage's `full_content` (the model's text so far) is null when it is the
  previous on_chunk stage's plus `grow` (the reader rebuilds it), so a stream's text is
  carried once, not once per chunk; `grow` is left out where it is null.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field
from pydantic_core import to_json

from hookbus.bus.wire.chunk_batch import CHUNK_WIRE, ChunkIn, ChunkWire
from hookbus.bus.wire.envelopes import FIELD, Envelope
from hookbus.skills.context import Context
from hookbus.skills.data import HookData
from hookbus.skills.observing import StageSeen

OBSERVATIONS_VERSION = 1


class ObservedStage(BaseModel):
    """One stage of the request as its observers in the group get it."""

    lifecycle: str
    stage_key: str
    hooks: list[str] = Field(description="Keys (skill.method) of the group's observers of this stage, in order.")
    started: float = Field(description="Unix time the stage began.")
    ended: float = Field(description="Unix time the stage ended.")
    state: dict[str, Any] | None = Field(
        default=None, description="ctx.state as the stage ended; null: as at the stage before."
    )
    grow: str | None = Field(
        default=None,
        description="on_chunk: the text that extends the previous on_chunk stage's full_content "
        "to this one's (then the data has no full_content).",
    )
    data: HookData


class ObservationBatch(Envelope):
    """A request's observations for one worker group (see the module docstring)."""

    versions: ClassVar[frozenset[int]] = frozenset({OBSERVATIONS_VERSION})

    kind: Literal["observations"] = "observations"
    completion_id: str
    group: str
    ctx: Context = Field(description="The request's context as it ended, without state (each stage has its own).")
    stages: list[ObservedStage]

    def seen(self) -> list[tuple[list[str], StageSeen]]:
        """Each stage's observer keys and the stage, every state and full_content filled in."""
        seen: list[tuple[list[str], StageSeen]] = []
        state: dict[str, Any] = {}
        full = ""
        for stage in self.stages:
            if stage.state is not None:
                state = stage.state
            data = stage.data
            if data.lifecycle == "on_chunk":
                if stage.grow is not None:
                    full += stage.grow
                    data.set_internal(full_content=full)
                else:
                    full = data.full_content or ""
            seen.append((stage.hooks, StageSeen(data, state, stage.stage_key, stage.started, stage.ended)))
        return seen


class BatchWriter:
    """Collects one request's stages for one group, each dumped as it ended; `fields()`
    is the entry."""

    def __init__(self, group: str) -> None:
        self.group = group
        self._stages: list[bytes] = []
        self._last_state: bytes | None = None
        self._last_full: str | None = None
        self._hooks: Sequence[str] = ()
        self._hooks_json = b"[]"

    def __len__(self) -> int:
        return len(self._stages)

    def add(self, data: HookData, hooks: Sequence[str], stage_key: str, started: float, ended: float,
            state_json: bytes) -> None:
        """One stage; `state_json` is ctx.state's JSON as it ended (shared by the groups)."""
        grow: bytes | None = None
        if data.lifecycle == "on_chunk":
            grow = self._grow(data.full_content or "")
        dumped = data.model_dump_json(exclude_defaults=True, exclude=None if grow is None else {"full_content"})
        self._append(data.lifecycle, hooks, stage_key, started, ended, state_json, grow, dumped.encode())

    def add_chunk(self, chunk: ChunkIn, hooks: Sequence[str], stage_key: str, started: float, ended: float,
                  state_json: bytes) -> None:
        """An on_chunk stage no hook ran at, from the chunk as it came: what `add` writes for
        `chunk.data()`, without building that HookData (a stream's every chunk comes here)."""
        grow = self._grow(chunk.full)
        wire: ChunkWire = {"lifecycle": "on_chunk", "chunk": chunk.chunk, "content": chunk.content,
                            "chunk_index": chunk.index}
        if grow is None:
            wire["full_content"] = chunk.full
        if chunk.held is not None:
            wire["held"] = chunk.held
        self._append("on_chunk", hooks, stage_key, started, ended, state_json, grow,
                     CHUNK_WIRE.dump_json(wire, exclude_defaults=True))

    def _grow(self, full: str) -> bytes | None:
        """An on_chunk stage's `grow` (JSON), None when its full_content goes whole."""
        last, self._last_full = self._last_full, full
        return to_json(full[len(last):]) if last is not None and full.startswith(last) else None

    def _append(self, lifecycle: str, hooks: Sequence[str], stage_key: str, started: float, ended: float,
                state_json: bytes, grow: bytes | None, data_json: bytes) -> None:
        """The stage's JSON, `state` and `grow` left out when null (their default)."""
        if hooks is not self._hooks:  # the same observers stage after stage, as a rule
            self._hooks, self._hooks_json = hooks, to_json(hooks)
        parts = [b'{"lifecycle":', to_json(lifecycle), b',"stage_key":', to_json(stage_key), b',"hooks":',
                 self._hooks_json, b',"started":', to_json(started), b',"ended":', to_json(ended)]
        if state_json != self._last_state:
            parts += (b',"state":', state_json)
            self._last_state = state_json
        if grow is not None:
            parts += (b',"grow":', grow)
        parts += (b',"data":', data_json, b"}")
        self._stages.append(b"".join(parts))

    def fields(self, completion_id: str, ctx_json: bytes) -> dict[bytes, bytes]:
        """The entry: `ctx_json` is the request's Context JSON as it ended, without state."""
        envelope = (
            b'{"v":' + to_json(OBSERVATIONS_VERSION) + b',"kind":"observations","completion_id":'
            + to_json(completion_id) + b',"group":' + to_json(self.group) + b',"ctx":' + ctx_json
            + b',"stages":[' + b",".join(self._stages) + b"]}"
        )
        return {FIELD: envelope}
