"""The committed protocol spec (services/protocol/spec/) is what the models generate, and real
messages, as the Python worker and orchestrator write them, validate against its schemas."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from openai.types.chat import ChatCompletionChunk

from hookbus.bus.groups.registry import GroupAnnouncement, ReplicaHeartbeat
from hookbus.bus.wire.chunk_batch import dump_chunks, dump_results
from hookbus.bus.wire.envelopes import (
    CTX_FIELD,
    DATA_FIELD,
    FIELD,
    HookRef,
    HopEvent,
    HopReply,
    encode_hop,
    encode_reply,
)
from hookbus.bus.wire.protocol_version import PROTOCOL
from hookbus.services.protocol.conformance.skills import Probe
from hookbus.services.protocol.spec import REVISIONS, SPEC_DIR, spec_files
from hookbus.services.worker.host import GroupHost
from hookbus.skills import Context, HookData, HookError
from tests.streamed import chunks_in

REGENERATE = "run `hookbus protocol --out services/protocol/spec` and commit the result"


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return spec_files()


def test_the_committed_spec_is_what_the_models_generate(generated: dict[str, str]) -> None:
    committed = {str(p.relative_to(SPEC_DIR)): p.read_text() for p in SPEC_DIR.rglob("*.json")}
    assert sorted(committed) == sorted(generated), REGENERATE
    for path, body in generated.items():
        assert committed[path] == body, f"{path} drifted from the models: {REGENERATE}"


def test_the_spec_names_the_version_and_its_revisions(generated: dict[str, str]) -> None:
    index = json.loads(generated["protocol.json"])
    assert index["protocol"] == PROTOCOL == REVISIONS[-1].version
    assert json.loads(generated["asyncapi.json"])["info"]["version"] == PROTOCOL
    assert [r["version"] for r in index["revisions"]] == [r.version for r in REVISIONS]
    for message in index["messages"].values():
        assert message["schema"] in generated


def test_hookbus_protocol_writes_the_same_files(tmp_path: Path, generated: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "-m", "hookbus.services.cli.main", "protocol", "--out", str(tmp_path)],
        check=True, capture_output=True, timeout=60,
    )
    assert {str(p.relative_to(tmp_path)): p.read_text() for p in tmp_path.rglob("*.json")} == generated


def _validator(generated: dict[str, str], name: str) -> Draft202012Validator:
    schema = json.loads(generated[f"schemas/{name}.json"])
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _valid(generated: dict[str, str], name: str, raw: bytes | str) -> None:
    errors = [e.message for e in _validator(generated, name).iter_errors(json.loads(raw))]
    assert not errors, f"{name}: {errors[:3]}"


def test_real_messages_validate_against_the_schemas(generated: dict[str, str]) -> None:
    ctx = Context.model_validate({"metadata": {"completion_id": "chatcmpl-1"}, "state": {"a": 1}})
    data = HookData(lifecycle="on_connection", messages=[{"role": "user", "content": "hi"}], stream=True)
    hop = HopEvent(
        hop_id="h1", completion_id="chatcmpl-1", lifecycle="on_connection", stage_key="on_connection",
        hooks=[HookRef(skill="probe", method="connection")], ctx={}, reply_to="hookbus:replies:o", deadline=1.0,
    )
    fields = encode_hop(hop, data.model_dump_json().encode(), ctx.model_dump_json().encode())
    _valid(generated, "HopEvent", fields[FIELD])
    _valid(generated, "Context", fields[CTX_FIELD])
    _valid(generated, "HookData", fields[DATA_FIELD])
    reply = HopReply(
        v=2, hop_id="h1", completion_id="chatcmpl-1", replica="r", state={"a": 2},
        abort=HookError(429, "probe_limit", "slow down", {"retry_after": 7}).to_dict(),
        data_json=data.model_dump_json().encode(),
    )
    reply_fields = encode_reply(reply)
    _valid(generated, "HopReply", reply_fields[FIELD])
    finalize = HookData(lifecycle="finalize_connection", error=HookError(500, "hook_failed", "x"))
    _valid(generated, "HookData", finalize.model_dump_json())
    chunk = ChatCompletionChunk.model_validate({
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}],
    })
    batch = chunks_in([(chunk, "Hi"), (chunk, "Hi")])
    for kept in (False, True):
        _valid(generated, "ChunkBatch", dump_chunks(batch, kept=kept))
    _valid(generated, "ChunkResults", dump_results([None, batch[1].data().model_dump_json().encode()]))
    _valid(generated, "GroupAnnouncement", GroupHost("conformance", [Probe()]).announcement().model_dump_json())
    _valid(generated, "ReplicaHeartbeat", ReplicaHeartbeat(group="g", replica="r").model_dump_json())


def test_the_schemas_refuse_what_the_models_refuse(generated: dict[str, str]) -> None:
    assert not _validator(generated, "ReplicaHeartbeat").is_valid({"group": "g", "replica": "r", "protocol": "two"})
    assert not _validator(generated, "HopEvent").is_valid({"hop_id": "h"})
    with pytest.raises(ValueError):
        GroupAnnouncement.model_validate({"hooks": []})
    assert not _validator(generated, "GroupAnnouncement").is_valid({"hooks": []})
