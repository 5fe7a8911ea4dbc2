"""The gateway page's examples (docs/gateway.md) run, as written, against a real gateway.

The blocks use the synchronous `openai` client, as a user's script would, so they run in a
thread: the stack they talk to runs on this test's event loop. The only edits are the
two a reader makes too: the gateway's address, and the key in `$KEY`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tests.doc_blocks import marked_block
from tests.gateway.conftest import KEY

DOCUMENTED_URL = "http://localhost:8000/v1"


def run_block(marker: str, gateway: Any, namespace: dict[str, Any]) -> None:
    block = marked_block(marker)
    exec(block.compiled(block.code.replace(DOCUMENTED_URL, gateway.v1)), namespace)


async def test_the_chat_completions_example_runs_and_prints_the_answer_and_its_usage(gateway, monkeypatch, capsys):
    monkeypatch.setenv("KEY", KEY)
    namespace: dict[str, Any] = {}
    await asyncio.to_thread(run_block, "gateway-openai", gateway, namespace)
    printed = capsys.readouterr().out
    assert printed.count("Offline model reply to: Hello!") == 2  # not streamed, then streamed
    usage = printed.rstrip().splitlines()[-1]
    assert usage.startswith("[") and usage.endswith(" tokens]") and int(usage[1:].split()[0]) > 0
    namespace["client"].close()


async def test_the_responses_example_continues_the_stored_response(gateway, monkeypatch, capsys):
    monkeypatch.setenv("KEY", KEY)
    namespace: dict[str, Any] = {}
    await asyncio.to_thread(run_block, "gateway-openai", gateway, namespace)
    await asyncio.to_thread(run_block, "gateway-responses", gateway, namespace)
    response, final = namespace["response"], namespace["final"]
    assert response.id.startswith("resp_") and response.usage.total_tokens > 0
    assert f"{response.output_text} {response.usage.total_tokens}" in capsys.readouterr().out
    assert final.status == "completed" and final.id != response.id
    assert final.previous_response_id == response.id
    assert final.output_text.startswith("Offline model reply to:")
    namespace["client"].close()
