"""`hookbus run` (`make run`): the whole stack on one machine, then a demo request.

Starts an embedded Redis when REDIS_URL is unset, then an orchestrator, a hook-worker
group hosting the built-in skills (two replicas) and the gateway, each as its own
process, exactly as they run in production. It sends one streamed request through
the queue, prints the answer as it streams and the request's lifecycle events, and then
keeps running (interactive) or stops (`--once`, or when not on a terminal).

`--agent mymodule:agent` (repeatable) serves the user's agents instead of the demo agent,
from modules in the current folder too (hookbus.services.cli.specs), in one orchestrator;
the demo request then goes to each of them by name.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from hookbus.bus import run_state
from hookbus.bus.client import DEFAULT_TIMEOUT, HookbusClient
from hookbus.bus.connection.cluster import keys_for
from hookbus.bus.connection.embedded import EmbeddedRedis, free_port, leave_with_parent
from hookbus.bus.connection.retrying import connect
from hookbus.bus.groups.served_agents import AgentsView
from hookbus.bus.settings import OFFLINE_MODEL, get_settings
from hookbus.services.cli.monitor import format_event, read_status, recent_events, wait_for
from hookbus.services.console import CONSOLE_PATH, request_link
from hookbus.skills import HookbusError

BUILTIN_GROUP = "builtin"
BUILTIN_SKILLS = [
    "hookbus.skills.builtin:RequestLogger",
    "hookbus.skills.builtin:SecuritySkill",
    "hookbus.skills.builtin:ContentFilter",
    "hookbus.skills.builtin:PerformanceMonitor",
    "hookbus.skills.builtin:AnalyticsSkill",
]
DEMO_AGENT = "hookbus.services.orchestrator.demo:agent"
DEMO_FAILED = 2
"""`demo`'s answer when the services came up but the demo request failed."""
DEMO_PROMPT = 'What is 2 + 3? [[tool:add {"a": 2, "b": 3}]]'
"""The demo request to the offline model, whose directive makes it call the tool."""
AGENT_PROMPT = "Hello! What can you do?"
"""The demo request to each of the user's own agents (whose tools `hookbus run` does not know)."""
REAL_MODEL_EXAMPLE = [
    {"role": "user", "content": "Which city is the capital of Italy?"},
    {"role": "assistant", "content": "Rome."},
]
"""One exchange before the real model's demo question: a base (pretrained) model, such as the
Gemma 3 270M GGUF `make check-real-model MODEL=gemma` serves, continues a conversation in the form it is
shown but echoes a bare question; an instruction-tuned one answers either way."""
REAL_MODEL_PROMPT = "Which city is the capital of France?"
REAL_MODEL_SETTINGS = {"temperature": 0, "max_tokens": 24}
"""The same answer on every run, and short: a base model runs on until its token limit."""
STATE_DIR = run_state.STATE_DIR


def run_stack(*, keep_running: bool, port: int, replicas: int, agents: Sequence[str] = ()) -> int:
    """`agents`: `pkg.module:attr` specs of the agents to serve instead of the demo agent."""
    settings = get_settings()
    try:
        run_state.claim(STATE_DIR)
    except run_state.StackRunning as exc:
        say(str(exc))
        return 1
    embedded: EmbeddedRedis | None = None
    redis_url = settings.redis_url
    if not redis_url:
        embedded = EmbeddedRedis(directory=STATE_DIR / "redis", port=free_port(), detached=True)
        redis_url = embedded.start()
        say(
            f"started an embedded Redis on 127.0.0.1:{embedded.port} with a random password "
            f"(its URL is in {STATE_DIR / 'redis-url'}, AOF in {embedded.directory})"
        )
    run_state.publish(redis_url, STATE_DIR)
    env = dict(os.environ, REDIS_URL=redis_url, HOOKBUS_LOG_FORMAT="json", PYTHONUNBUFFERED="1")
    if not settings.openai_base_url:  # the orchestrator serves the stand-in only when asked by name
        env["HOOKBUS_MODEL"] = OFFLINE_MODEL
    logs = STATE_DIR / "logs"
    logs.mkdir(exist_ok=True)
    port = port if port_is_free(port) else free_port()
    commands = {
        "orchestrator": ["orchestrator", *(a for spec in agents or [DEMO_AGENT] for a in ("--agent", spec))],
        **{
            f"worker-{n}": ["worker", "--group", BUILTIN_GROUP, *BUILTIN_SKILLS, "--replica", f"{BUILTIN_GROUP}-{n}"]
            for n in range(1, replicas + 1)
        },
        "gateway": ["gateway", "--port", str(port)],
    }
    # Each service in a session of its own: a Ctrl-C in the terminal reaches `hookbus run`
    # only, which stops the services first and Redis last, instead of every process at once
    # (the services then spent their shutdown retrying a Redis that had already exited).
    processes = {
        name: subprocess.Popen(
            [sys.executable, "-m", "hookbus.services.cli.main", *argv],
            env=env,
            stdout=(logs / f"{name}.log").open("ab"),
            stderr=subprocess.STDOUT,
            preexec_fn=leave_with_parent,
        )
        for name, argv in commands.items()
    }
    say(f"started {', '.join(processes)} (logs in {logs}/)")
    if not settings.openai_base_url:
        say(
            "no OPENAI_BASE_URL: the agent answers with the built-in offline model, a "
            "deterministic stand-in for demos and tests (not an AI)"
        )
    try:
        prompt = REAL_MODEL_PROMPT if settings.openai_base_url else AGENT_PROMPT if agents else DEMO_PROMPT
        served: list[str] = []
        code = asyncio.run(demo(redis_url, settings.prefix, replicas, port, prompt, len(agents), served))
        if code in (0, DEMO_FAILED) and keep_running:
            stop = catch_stop_signals()  # before saying Ctrl-C stops it: a Ctrl-C right after must stop it cleanly
            say(
                "the stack keeps running; Ctrl-C stops it. In another terminal:\n"
                f"    .venv/bin/hookbus send {'--agent NAME ' if agents else ''}'hello'            # one request through the queue\n"
                f"    .venv/bin/hookbus status                  # groups, replicas, lag\n"
                f"    .venv/bin/hookbus monitor                 # follow events live\n"
                f"    open http://127.0.0.1:{port}{CONSOLE_PATH}     # the web console\n"
                f"    .venv/bin/hookbus worker --group {BUILTIN_GROUP} {' '.join(BUILTIN_SKILLS)}   # one more replica\n"
                f"    {curl_line(port, served[0] if served else settings.served_model)}"
            )
            wait_for_signal(processes, stop)
            return 0
        return 1 if code == DEMO_FAILED else code
    finally:
        stop_all(processes)
        if embedded is not None:
            embedded.stop()
        run_state.release(STATE_DIR)
        say("stopped")


async def demo(
    redis_url: str, prefix: str, replicas: int, port: int, prompt: str, agents: int = 0, served_names: list[str] | None = None
) -> int:
    """The demo request (to each of `agents` user agents by name, once they are served:
    their names are added to `served_names`)."""
    keys = keys_for(redis_url, prefix)
    client = connect(redis_url)
    served = AgentsView(client, keys)

    async def ready() -> bool:
        status = await read_status(client, keys)
        group = next((g for g in status.groups if g.name == BUILTIN_GROUP), None)
        return (
            bool(status.orchestrators) and group is not None and len(group.replicas) >= replicas
            and len((await served.refresh()).live) >= agents
        )

    if not await wait_for(ready, timeout=60):
        say("the services did not come up within 60 s; see .hookbus/logs/")
        await client.aclose()
        return 1
    await asyncio.sleep(0.6)  # let the orchestrator's registry view see the group
    say(f"gateway on http://127.0.0.1:{port}/v1 ; console on http://127.0.0.1:{port}{CONSOLE_PATH}")
    names: list[str | None] = list(served.current.live) if agents else [None]
    if agents and served_names is not None:
        served_names += served.current.live
    if agents:
        say(f"serving the agents {', '.join(served.current.live)} (pick one with the `model` field, "
            "`hookbus send --agent NAME` or `HookbusClient(agent=NAME)`)")
    completion_id = ""
    for name in names:
        completion_id = await demo_request(redis_url, prefix, prompt, name)
        if not completion_id:
            await client.aclose()
            return DEMO_FAILED
    await asyncio.sleep(0.3)  # the event writers flush every few ms
    say(f"lifecycle events of {completion_id} (hookbus monitor --completion-id {completion_id[-12:]}):")
    records = [
        r for r in await recent_events(client, keys, 2000)
        if r.completion_id == completion_id and r.kind != "hop"  # each hop also has its stage line
    ]
    for record in sorted(records, key=lambda r: r.ts):
        print("  " + format_event(record))
    say(f"its waterfall: {request_link(completion_id, f'http://127.0.0.1:{port}')}")
    await client.aclose()
    return 0


async def demo_request(redis_url: str, prefix: str, prompt: str, agent: str | None) -> str:
    """One streamed request, printed as it streams; its completion id ("" if it failed)."""
    say(f"sending a streamed request through the queue{f' to agent {agent}' if agent else ''}:")
    # A real model on a small machine can take minutes for a tool round; the offline one, ms.
    real = prompt == REAL_MODEL_PROMPT
    messages = [*REAL_MODEL_EXAMPLE, {"role": "user", "content": prompt}] if real else [{"role": "user", "content": prompt}]
    shown = "".join(f"\n{'>>>' if m['role'] == 'user' else '<<<'} {m['content']}" for m in messages)
    print(f"{shown}\n<<< ", end="", flush=True)
    timeout = DEFAULT_TIMEOUT if real else 60
    async with HookbusClient(redis_url, prefix=prefix, timeout=timeout, agent=agent) as hookbus:
        completion_id = ""
        try:
            stream = hookbus.stream(messages, session_id="demo", model_settings=REAL_MODEL_SETTINGS if real else None)
            async for chunk in stream:
                completion_id = chunk.id
                if chunk.choices and chunk.choices[0].delta.content:
                    print(chunk.choices[0].delta.content, end="", flush=True)
        except HookbusError as exc:  # a slow or failing model must not take the stack down
            print()
            say(f"the demo request failed ({exc.status_code} {exc.code}: {exc.message}); the services are up")
            return ""
    print("\n")
    return completion_id


def catch_stop_signals() -> dict[str, bool]:
    """SIGINT and SIGTERM from now on set `["now"]` instead of interrupting."""
    stop = {"now": False}

    def handler(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


def wait_for_signal(processes: dict[str, subprocess.Popen[bytes]], stop: dict[str, bool]) -> None:
    while not stop["now"]:
        for name, process in processes.items():
            if process.poll() is not None:
                say(f"{name} exited with {process.returncode}; stopping")
                return
        time.sleep(0.1)  # a Ctrl-C is acted on within this


def stop_all(processes: dict[str, subprocess.Popen[bytes]]) -> None:
    for process in processes.values():
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 40
    for process in processes.values():
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()


def curl_line(port: int, model: str) -> str:
    """A request a user can paste: JSON with its Content-Type, for the model the gateway serves."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    return (
        f"curl -s localhost:{port}/v1/chat/completions "
        f"-H 'Content-Type: application/json' -d '{body}'"
    )


def port_is_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def say(message: str) -> None:
    print(f"hookbus: {message}", flush=True)
