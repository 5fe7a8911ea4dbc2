"""The `hookbus` command line: run the services, send requests, watch the bus.

Every command reads its settings from the environment (hookbus.bus.settings.Settings). Without
REDIS_URL, commands use the Redis of a running `hookbus run` (its URL is kept in
`.hookbus/redis-url` in the current directory); `hookbus run` itself starts an embedded
Redis server when there is none.

Each command imports what it uses when it runs, never at the top of this module: the light
ones (`--help`, `status`, `rollout`, `health`) must not load the agent, the openai client or
FastStream (tests/integration/test_cli_imports.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from hookbus.bus.limits import RequestLimits
from hookbus.bus.settings import get_settings
from hookbus.services.cli.rollout_command import add_rollout_parser
from hookbus.services.gateway.edge_options import EdgeOptions
from hookbus.services.process import defaults, event_loop, heap

CONTEXT_WINDOW_HELP = "the model's context window, for a model hookbus does not know (= HOOKBUS_CONTEXT_WINDOW)"
AGENT_HELP = "the served agent to ask, by its name (default: whichever the deployment serves)"


def redis_url_or_exit() -> str:
    """REDIS_URL, else the URL a running `hookbus run` left behind, else a clear error."""
    from hookbus.bus import run_state

    url = run_state.redis_url()
    if url:
        return url
    sys.exit(
        "hookbus: no Redis to talk to. Set REDIS_URL=redis://host:port/0, "
        "or start the whole stack on an embedded Redis with `hookbus run` (`make run`)."
    )


# ------------------------------------------------------------------------ services


def cmd_worker(args: argparse.Namespace) -> int:
    from hookbus.bus.connection.retrying import instance_name
    from hookbus.services.cli.specs import SpecError, load_skill
    from hookbus.services.observability.logs import configure_logging
    from hookbus.services.observability.tracing import configure_tracing
    from hookbus.services.worker.host import GroupHost
    from hookbus.services.worker.replica import WorkerReplica

    configure_logging()
    try:
        skills = [load_skill(spec) for spec in args.skills]
    except SpecError as exc:
        sys.exit(f"hookbus worker: {exc}")
    replica_name = args.replica or instance_name(f"worker-{args.group}")
    configure_tracing("worker", replica_name)
    try:
        replica = WorkerReplica(
            GroupHost(args.group, skills, agents=args.agent),
            redis_url_or_exit(),
            prefix=get_settings().prefix,
            concurrency=args.concurrency,
            replica=replica_name,
            claim_idle=args.claim_idle,
            max_deliveries=args.max_deliveries,
            version=args.version,
        )
    except ValueError as exc:  # a version that cannot name a stream, an agent name that cannot be served
        sys.exit(f"hookbus worker: {exc}")
    heap.settle()
    event_loop.run(replica.app.run())
    return 0


def cmd_orchestrator(args: argparse.Namespace) -> int:
    from hookbus.bus.connection.retrying import instance_name
    from hookbus.services.cli.specs import SpecError, load_agent
    from hookbus.services.observability.logs import configure_logging
    from hookbus.services.observability.tracing import configure_tracing
    from hookbus.services.orchestrator.llm.client import NoEndpoint, require_endpoint
    from hookbus.services.orchestrator.serving import OrchestratorService

    configure_logging()
    use_context_window(args.context_window)
    try:
        agents = [load_agent(spec) for spec in args.agent]
        for agent in agents:
            require_endpoint(agent.llm)
    except (SpecError, NoEndpoint) as exc:
        sys.exit(f"hookbus orchestrator: {exc}")
    instance = args.instance or instance_name("orchestrator")
    configure_tracing("orchestrator", instance)
    try:
        service = OrchestratorService(
            agents,
            redis_url_or_exit(),
            prefix=get_settings().prefix,
            concurrency=args.concurrency,
            instance=instance,
            claim_idle=args.claim_idle,
            max_deliveries=args.max_deliveries,
            limits=limits_of(args),
        )
    except ValueError as exc:  # an agent name that cannot be served, or two agents of one name
        sys.exit(f"hookbus orchestrator: {exc}")
    heap.settle()
    event_loop.run(service.app.run())
    return 0


def cmd_gateway(args: argparse.Namespace) -> int:
    from hookbus.bus.connection.retrying import instance_name
    from hookbus.services.gateway.server import serve
    from hookbus.services.observability.logs import configure_logging
    from hookbus.services.observability.tracing import configure_tracing

    configure_logging()
    configure_tracing("gateway", instance_name("gateway"))
    heap.settle()
    try:
        edge = EdgeOptions(
            header_timeout=args.header_timeout, body_timeout=args.body_timeout, stall_timeout=args.stall_timeout,
            max_connections=args.max_connections, max_connections_per_address=args.max_connections_per_address,
            **({"allowed_hosts": args.allowed_hosts.split(",")} if args.allowed_hosts is not None else {}),
        )
        serve(
            args.host, args.port, args.api_keys, redis_url_or_exit(), get_settings().prefix,
            limits=limits_of(args), edge=edge,
        )
    except (ValueError, OSError) as exc:
        print(f"hookbus gateway: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_console(args: argparse.Namespace) -> int:
    from hookbus.services.console.app import serve_console
    from hookbus.services.gateway.auth import load_api_keys
    from hookbus.services.observability.logs import configure_logging

    configure_logging()
    try:
        api_keys = load_api_keys(args.api_keys)
    except (ValueError, OSError) as exc:
        print(f"hookbus console: {exc}", file=sys.stderr)
        return 2
    serve_console(args.host, args.port, api_keys, redis_url_or_exit(), get_settings().prefix)
    return 0


# ------------------------------------------------------------------------- clients


def cmd_send(args: argparse.Namespace) -> int:
    from hookbus.bus.client import HookbusClient
    from hookbus.skills import HookbusError

    async def send() -> int:
        async with HookbusClient(redis_url_or_exit(), timeout=args.timeout, agent=args.agent) as client:
            try:
                if args.no_stream:
                    completion = await client.complete(args.text, session_id=args.session)
                    print(completion.choices[0].message.content or "")
                else:
                    async for chunk in client.stream(args.text, session_id=args.session):
                        if chunk.choices and chunk.choices[0].delta.content:
                            print(chunk.choices[0].delta.content, end="", flush=True)
                    print()
            except HookbusError as exc:
                print(f"\nerror {exc.status_code} {exc.code}: {exc.message}", file=sys.stderr)
                return 1
        return 0

    return asyncio.run(send())


def cmd_monitor(args: argparse.Namespace) -> int:
    from hookbus.bus.connection.cluster import keys_for
    from hookbus.bus.connection.retrying import connect
    from hookbus.services.cli.monitor import EventFilter, follow_events, format_event

    selection = EventFilter(args.completion_id, args.lifecycle, args.group, args.errors, args.agent)

    async def monitor() -> None:
        client = connect(redis_url_or_exit(), retries=0)
        shown = 0
        keys = keys_for(redis_url_or_exit(), get_settings().prefix)
        async for record in follow_events(client, keys, from_start=args.from_start):
            if selection.matches(record):
                print(format_event(record, with_link=True), flush=True)
                shown += 1
                if args.count and shown >= args.count:
                    return

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(monitor())
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from hookbus.bus.connection.cluster import keys_for
    from hookbus.bus.connection.retrying import RECONNECT_ERRORS, connect
    from hookbus.bus.settings import redact_url
    from hookbus.services.cli.monitor import format_status, read_status

    url = redis_url_or_exit()

    async def status() -> None:
        client = connect(url, retries=2)
        try:
            result = await read_status(client, keys_for(url, get_settings().prefix))
        finally:
            await client.aclose()
        if args.agent:
            result = result.of_agent(args.agent)
        print(result.model_dump_json(indent=2) if args.json else format_status(result))

    try:
        asyncio.run(status())
    except RECONNECT_ERRORS as exc:
        sys.exit(f"hookbus status: cannot reach Redis at {redact_url(url)} ({exc})")
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    from hookbus.services.cli.health import check_health

    ok, message = asyncio.run(check_health(redis_url_or_exit(), get_settings().prefix, args.role, args.group))
    print(message)
    return 0 if ok else 1


def cmd_chat(args: argparse.Namespace) -> int:
    from hookbus.services.cli.chat import run_chat

    use_context_window(args.context_window)
    if args.local and args.agent:
        sys.exit("hookbus chat: --agent picks a served agent; --local runs the configured one in this process")
    return run_chat(local=args.local, agent_name=args.agent)


def use_context_window(tokens: int | None) -> None:
    """`--context-window N` is `HOOKBUS_CONTEXT_WINDOW=N` for this process: set before the
    agent is built, since an agent reads its settings then."""
    if tokens is not None:
        if tokens <= 0:
            sys.exit("hookbus: --context-window must be a positive number of tokens")
        os.environ["HOOKBUS_CONTEXT_WINDOW"] = str(tokens)


def cmd_run(args: argparse.Namespace) -> int:
    from hookbus.services.cli.run_stack import run_stack

    keep = args.keep if args.keep is not None else sys.stdin.isatty()
    return run_stack(keep_running=keep, port=args.port, replicas=args.replicas, agents=args.agent or ())


def cmd_docs(args: argparse.Namespace) -> int:
    import hookbus.services.protocol.asyncapi as docs

    if args.kind == "asyncapi":
        document = docs.asyncapi_document(get_settings().prefix)
    else:
        document = docs.openapi_document()
    print(json.dumps(document, indent=2))
    return 0


def cmd_protocol(args: argparse.Namespace) -> int:
    from hookbus.services.protocol.spec import write_spec

    for path in write_spec(Path(args.out)):
        print(path)
    return 0


def cmd_conformance(args: argparse.Namespace) -> int:
    from hookbus.services.protocol.conformance.kit import run_kit

    command = args.worker_command[1:] if args.worker_command[:1] == ["--"] else args.worker_command
    if not command:
        sys.exit("hookbus conformance: give the command that starts a worker after `--`")
    return run_kit(command, include_kill=not args.no_kill, only=args.check or ())


def cmd_settings(args: argparse.Namespace) -> int:
    from hookbus.bus.settings import Settings

    settings = get_settings()
    for name, field in Settings.model_fields.items():
        print(f"{field.alias:<20} {settings.shown(name):<30} {field.description or ''}")
    return 0


# --------------------------------------------------------------------------- parser


def add_model_options(parser: argparse.ArgumentParser, model: type[BaseModel], title: str) -> None:
    """One option per numeric field of `model`, named after it, with its default and description."""
    group = parser.add_argument_group(title)
    for name, field in model.model_fields.items():
        number = {int: int, float: float}.get(field.annotation)  # type: ignore[arg-type]
        if number is not None:
            group.add_argument(
                f"--{name.replace('_', '-')}", type=number, default=field.default, metavar="N",
                help=f"{field.description} (default {field.default})",
            )


def add_limit_options(parser: argparse.ArgumentParser) -> None:
    """The request limits (hookbus.bus.limits): give the gateway and the orchestrators the same."""
    add_model_options(parser, RequestLimits, "request limits (the same on the gateway and the orchestrators)")


def limits_of(args: argparse.Namespace) -> RequestLimits:
    try:
        return RequestLimits(**{name: getattr(args, name) for name in RequestLimits.model_fields})
    except ValueError as exc:
        sys.exit(f"hookbus {args.command}: invalid request limits: {exc}")



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hookbus",
        description="An AI agent's request lifecycle as events on Redis Streams.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    worker = commands.add_parser("worker", help="run one replica of a hook-worker group")
    worker.add_argument("--group", required=True, help="worker group name (its stream is hooks:NAME)")
    worker.add_argument("skills", nargs="+", metavar="pkg.module:SkillClass", help="skills this group hosts")
    worker.add_argument("--concurrency", type=int, default=defaults.WORKER_CONCURRENCY, help="hops in flight (and prefetched) at most")
    worker.add_argument("--replica", default=None, help="consumer name (default: worker-GROUP-HOST-PID)")
    worker.add_argument("--claim-idle", type=float, default=defaults.WORKER_CLAIM_IDLE, help="seconds before a dead sibling's entry is claimed")
    worker.add_argument("--max-deliveries", type=int, default=defaults.WORKER_MAX_DELIVERIES, help="deliveries before an entry is dead-lettered")
    worker.add_argument(
        "--version", default=None,
        help="the version this replica runs its group at (default: $HOOKBUS_WORKER_VERSION, the skills' "
        "declared versions, or a hash of their hooks); requests stay on the version they started with",
    )
    worker.add_argument(
        "--agent", default=None, action="append", metavar="NAME",
        help="serve only this agent's requests (repeatable; default: the agents the skills name, or all)",
    )
    worker.set_defaults(func=cmd_worker)

    orchestrator = commands.add_parser("orchestrator", help="run one orchestrator instance")
    orchestrator.add_argument(
        "--agent", required=True, action="append", metavar="pkg.module:agent",
        help="an Agent to serve, under its name (repeatable: one orchestrator may serve several)",
    )
    orchestrator.add_argument("--concurrency", type=int, default=defaults.ORCHESTRATOR_CONCURRENCY, help="requests in flight at most")
    orchestrator.add_argument("--instance", default=None, help="instance name (default: orchestrator-HOST-PID)")
    orchestrator.add_argument("--claim-idle", type=float, default=defaults.ORCHESTRATOR_CLAIM_IDLE, help="seconds before a dead orchestrator's request is claimed")
    orchestrator.add_argument("--max-deliveries", type=int, default=defaults.ORCHESTRATOR_MAX_DELIVERIES, help="deliveries before a request is set aside")
    add_limit_options(orchestrator)
    orchestrator.add_argument("--context-window", type=int, default=None, metavar="TOKENS", help=CONTEXT_WINDOW_HELP)
    orchestrator.set_defaults(func=cmd_orchestrator)

    gateway = commands.add_parser("gateway", help="run the OpenAI-compatible HTTP gateway")
    add_listen_options(
        gateway, 8000,
        'JSON {"<key>": {"peer_user_id": ..., "scopes": [...], "max_parallel_requests": N, "rpm_limit": N}}; '
        "without it (and without $HOOKBUS_API_KEYS) auth is off",
    )
    gateway.add_argument(
        "--allowed-hosts", default=None, metavar="H1,H2",
        help="Host names an auth-off gateway answers besides loopback ones (default $HOOKBUS_ALLOWED_HOSTS; * for any)",
    )
    add_model_options(gateway, EdgeOptions, "slow and many clients")
    add_limit_options(gateway)
    gateway.set_defaults(func=cmd_gateway)

    console = commands.add_parser("console", help="serve the web console without a gateway")
    add_listen_options(
        console, 8100,
        "the gateway's keys file; only keys with the hookbus:admin scope see the console "
        "(without it and $HOOKBUS_API_KEYS: loopback clients only)",
    )
    console.set_defaults(func=cmd_console)

    send = commands.add_parser("send", help="send one request through the queue and print the answer")
    send.add_argument("text")
    send.add_argument("--session", default=None, help="session id (conversation state)")
    send.add_argument("--no-stream", action="store_true", help="wait for the whole answer")
    send.add_argument("--timeout", type=float, default=120.0, help="seconds before giving up")
    send.add_argument("--agent", default=None, metavar="NAME", help=AGENT_HELP)
    send.set_defaults(func=cmd_send)

    monitor = commands.add_parser("monitor", help="follow lifecycle events live")
    monitor.add_argument("--completion-id", default=None, help="only this request (a prefix is enough)")
    monitor.add_argument("--lifecycle", default=None)
    monitor.add_argument("--group", default=None)
    monitor.add_argument("--errors", action="store_true", help="only failures")
    monitor.add_argument("--agent", default=None, metavar="NAME", help="only this agent's requests")
    monitor.add_argument("--from-start", action="store_true", help="replay the capped history first")
    monitor.add_argument("--count", type=int, default=0, help="stop after N events")
    monitor.set_defaults(func=cmd_monitor)

    status = commands.add_parser("status", help="groups, replicas, lag, pending, orchestrators, throughput")
    status.add_argument("--json", action="store_true")
    status.add_argument("--agent", default=None, metavar="NAME", help="only this agent, its orchestrators and the groups serving it")
    status.set_defaults(func=cmd_status)

    add_rollout_parser(commands, redis_url_or_exit)

    health = commands.add_parser("health", help="exit 0 when this host's replica heartbeats are fresh")
    health.add_argument("--role", choices=["worker", "orchestrator"], default=None)
    health.add_argument("--group", default=None)
    health.set_defaults(func=cmd_health)

    chat = commands.add_parser("chat", help="chat in the terminal (through the queue, or --local)")
    chat.add_argument("--local", action="store_true", help="run the agent in this process")
    chat.add_argument("--agent", default=None, metavar="NAME", help=AGENT_HELP)
    chat.add_argument("--context-window", type=int, default=None, metavar="TOKENS", help=CONTEXT_WINDOW_HELP)
    chat.set_defaults(func=cmd_chat)

    run = commands.add_parser("run", help="the whole stack on an embedded Redis, with a demo request")
    run.add_argument("--port", type=int, default=8000, help="gateway port")
    run.add_argument("--replicas", type=int, default=2, help="worker replicas")
    run.add_argument("--keep", dest="keep", action="store_true", default=None, help="keep running after the demo")
    run.add_argument("--once", dest="keep", action="store_false", help="stop after the demo")
    run.add_argument(
        "--agent", action="append", metavar="pkg.module:agent",
        help="serve this agent instead of the demo (repeatable; modules in the current folder are found)",
    )
    run.set_defaults(func=cmd_run)

    docs = commands.add_parser("docs", help="print the AsyncAPI (bus) or OpenAPI (gateway) document")
    docs.add_argument("kind", choices=["asyncapi", "openapi"])
    docs.set_defaults(func=cmd_docs)

    protocol = commands.add_parser("protocol", help="write the worker protocol's spec (AsyncAPI, JSON Schemas)")
    protocol.add_argument("--out", default="services/protocol/spec", metavar="DIR", help="folder to write it to")
    protocol.set_defaults(func=cmd_protocol)

    conformance = commands.add_parser(
        "conformance", help="check a worker against the protocol: hookbus conformance -- COMMAND...",
        description=(
            "Starts an embedded Redis and an orchestrator, then COMMAND with REDIS_URL, HOOKBUS_PREFIX "
            "and HOOKBUS_GROUP in its environment (it must start a worker of that group hosting the "
            "kit's skills, docs/conformance.md), and checks it. One line per check; exit 1 on any failure."
        ),
    )
    conformance.add_argument("--no-kill", action="store_true", help="skip the check that kills and restarts the worker")
    conformance.add_argument("--check", action="append", metavar="NAME", help="run only this check (repeatable)")
    conformance.add_argument("worker_command", nargs=argparse.REMAINDER, metavar="-- COMMAND")
    conformance.set_defaults(func=cmd_conformance)

    settings = commands.add_parser("settings", help="print the settings and their environment variables")
    settings.set_defaults(func=cmd_settings)
    return parser


def add_listen_options(parser: argparse.ArgumentParser, port: int, keys_help: str) -> None:
    """--host, --port and --api-keys of a command that serves HTTP."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument("--api-keys", default=None, metavar="FILE", help=keys_help)


LONG_RUNNING = frozenset({"worker", "orchestrator", "gateway", "console", "run", "chat"})


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command not in LONG_RUNNING:
        # `hookbus monitor | head` ends quietly. Never for services: a socket that Redis
        # closed (a restart) would then kill the process instead of raising an error.
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(args.func(args))


if __name__ == "__main__":
    main()
