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

from typing import Any, ClassVar, Generic, Literal, NotRequired, TypeVar

from pydantic import BaseModel, Field, TypeAdapter
from pydantic_core import to_json
from typing_extensions import TypedDict

from hookbus.bus.wire.chunk_batch import ChunkIn, ChunkWire
from hookbus.bus.wire.envelopes import FIELD, Envelope
from hookbus.skills.context import Context
from hookbus.skills.data import HookData
from hookbus.skills.observing import StageSeen

OBSERVATIONS_VERSION = 1
D = TypeVar("D")


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


class _StageWire(TypedDict, Generic[D]):
    """An ObservedStage as `BatchWriter` dumps it, in one call with its data; its `state`
    (dumped already, to tell whether it changed) is added to the JSON after."""

    lifecycle: str
    stage_key: str
    hooks: list[str]
    started: float
    ended: float
    grow: NotRequired[str]
    data: D


_STAGE: TypeAdapter[_StageWire[HookData]] = TypeAdapter(_StageWire[HookData])
_CHUNK_STAGE: TypeAdapter[_StageWire[ChunkWire]] = TypeAdapter(_StageWire[ChunkWire])
_NO_FULL_CONTENT = {"data": {"full_content"}}


class BatchWriter:
    """Collects one request's stages for one group, each dumped as it ended; `fields()`
    is the entry."""

    def __init__(self, group: str) -> None:
        self.group = group
        self._stages: list[bytes] = []
        self._last_state: bytes | None = None
        self._last_full: str | None = None

    def __len__(self) -> int:
        return len(self._stages)

    def add(self, data: HookData, hooks: list[str], stage_key: str, started: float, ended: float,
            state_json: bytes) -> None:
        """One stage; `state_json` is ctx.state's JSON as it ended (shared by the groups)."""
        stage: _StageWire[HookData] = {"lifecycle": data.lifecycle, "stage_key": stage_key, "hooks": hooks,
                                       "started": started, "ended": ended, "data": data}
        grow = self._grow(data.full_content or "") if data.lifecycle == "on_chunk" else None
        if grow is not None:
            stage["grow"] = grow
        self._append(_STAGE.dump_json(stage, exclude_defaults=True, exclude=None if grow is None else _NO_FULL_CONTENT),
                     state_json)

    def add_chunk(self, chunk: ChunkIn, hooks: list[str], stage_key: str, started: float, ended: float,
                  state_json: bytes) -> None:
        """An on_chunk stage no hook ran at, from the chunk as it came: what `add` writes for
        `chunk.data()`, without building that HookData (a stream's every chunk comes here)."""
        wire: ChunkWire = {"lifecycle": "on_chunk", "chunk": chunk.chunk, "content": chunk.content,
                           "chunk_index": chunk.index}
        stage: _StageWire[ChunkWire] = {"lifecycle": "on_chunk", "stage_key": stage_key, "hooks": hooks,
                                        "started": started, "ended": ended, "data": wire}
        grow = self._grow(chunk.full)
        if grow is None:
            wire["full_content"] = chunk.full
        else:
            stage["grow"] = grow
        if chunk.held is not None:
            wire["held"] = chunk.held
        self._append(_CHUNK_STAGE.dump_json(stage, exclude_defaults=True), state_json)

    def _grow(self, full: str) -> str | None:
        """An on_chunk stage's `grow`, None when its full_content goes whole."""
        last, self._last_full = self._last_full, full
        return full[len(last):] if last is not None and full.startswith(last) else None

    def _append(self, stage_json: bytes, state_json: bytes) -> None:
        """The stage with its `state`, left out when as at the stage before (null, its default)."""
        if state_json != self._last_state:
            self._last_state = state_json
            stage_json = stage_json[:-1] + b',"state":' + state_json + b"}"
        self._stages.append(stage_json)

    def fields(self, completion_id: str, ctx_json: bytes) -> dict[bytes, bytes]:
        """The entry: `ctx_json` is the request's Context JSON as it ended, without state."""
        envelope = (
            b'{"v":' + to_json(OBSERVATIONS_VERSION) + b',"kind":"observations","completion_id":'
            + to_json(completion_id) + b',"group":' + to_json(self.group) + b',"ctx":' + ctx_json
            + b',"stages":[' + b",".join(self._stages) + b"]}"
        )
        return {FIELD: envelope}
