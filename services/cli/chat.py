"""`hookbus chat`: a terminal chat that keeps the conversation inside the context window.

    hookbus chat            # through the queue: needs a running stack (REDIS_URL)
    hookbus chat --local    # the agent runs in this process

The REPL keeps the whole conversation and sends it with every message. Before each
message it measures the message and asks `Agent.compact_if_needed` whether the
conversation plus the message would pass the compaction threshold; when it compacts, it
prints the outcome sentence ("Compacted the conversation: ... Context 23% full.") and
carries on with the compacted conversation. Answers are printed as they stream.

With `--local` the agent answering is the one compacting. Through the queue the answers
come from whatever agent the orchestrators run, and the REPL holds an `Agent` of its own
(same model: `HOOKBUS_MODEL`) only to decide and summarize compactions; skills of that
local agent (the memory skill) hear of them through `on_compaction(outcome, None)`.

Commands:
    /compact [focus]   compact now; the focus steers the summary
    /context           model, window, tokens used (percent), threshold, summary carried
    /new               start a new conversation
    /help              the commands
    /quit              leave (as does end of input)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import uuid
from collections.abc import AsyncGenerator
from typing import IO, Any, cast

from openai.types.chat import ChatCompletionChunk

from hookbus.bus import run_state
from hookbus.bus.client import HookbusClient
from hookbus.bus.settings import get_settings
from hookbus.services.orchestrator import Agent, Compaction
from hookbus.services.orchestrator.compaction.rules import AUTO_OFF, is_summary
from hookbus.services.orchestrator.compaction.tokens import count_message, count_messages
from hookbus.skills import HookbusError

PROMPT = "you> "
HELP = (
    "Commands: /compact [focus] (compact now), /context (how full the context is), "
    "/new (new conversation), /help, /quit"
)
async def chat(
    agent_or_client: Agent | HookbusClient,
    *,
    local: bool,
    input_stream: IO[str] | None = None,
    output: IO[str] | None = None,
    compactor: Agent | None = None,
    session_id: str | None = None,
) -> int:
    """Run the REPL until /quit or end of input; returns the exit status (0).

    `local=True`: `agent_or_client` is the `Agent` that answers (and compacts).
    `local=False`: it is a `HookbusClient`; `compactor` is the `Agent` that makes the
    compaction decisions and summaries (default: `Agent("chat")` with the configured
    model). `input_stream`/`output` default to stdin/stdout.
    """
    repl = _Repl(
        agent_or_client,
        local=local,
        compactor=compactor,
        output=output or sys.stdout,
        session_id=session_id,
    )
    return await repl.loop(input_stream or sys.stdin)


class _Repl:
    def __init__(
        self,
        target: Agent | HookbusClient,
        *,
        local: bool,
        compactor: Agent | None,
        output: IO[str],
        session_id: str | None,
    ) -> None:
        if local and not isinstance(target, Agent):
            raise TypeError("chat(local=True) needs an Agent")
        if not local and not isinstance(target, HookbusClient):
            raise TypeError("chat(local=False) needs a HookbusClient")
        self.target = target
        self.local = local
        self.compactor: Agent = target if isinstance(target, Agent) else (compactor or Agent("chat"))
        self.out = output
        self._fixed_session = session_id
        self.session_id = session_id or _session_id()
        self.conversation: list[dict[str, Any]] = self._fresh()

    # ------------------------------------------------------------------ loop

    async def loop(self, input_stream: IO[str]) -> int:
        mode = "local" if self.local else "through the queue"
        self.say(
            f"hookbus chat ({mode}; model {self.compactor.model}, "
            f"window {self.compactor.context_window} tokens). /help for commands."
        )
        while True:
            self.out.write(PROMPT)
            self.out.flush()
            line = await _readline(input_stream)
            if not line:  # end of input
                self.say("")
                return 0
            text = line.strip()
            if not text:
                continue
            if text.startswith("/"):
                if not await self.command(text):
                    return 0
                continue
            await self.send(text)

    async def command(self, text: str) -> bool:
        """Run one slash command; False means leave."""
        name, _, rest = text.partition(" ")
        name = name.lower()
        if name in ("/quit", "/exit", "/q"):
            return False
        if name == "/compact":
            await self.compact(rest.strip() or None)
        elif name == "/context":
            self.context()
        elif name == "/new":
            self.conversation = self._fresh()
            self.session_id = self._fixed_session or _session_id()
            self.say("Started a new conversation.")
        elif name == "/help":
            self.say(HELP)
        else:
            self.say(f"Unknown command {name}. {HELP}")
        return True

    # -------------------------------------------------------------- commands

    async def compact(self, focus: str | None) -> None:
        outcome = await self.compactor.compact(self.conversation, focus=focus)
        self._keep(outcome)
        self.say(outcome.sentence())

    def context(self) -> None:
        agent = self.compactor
        window = agent.context_window
        resolved = agent.compaction_policy.resolve(window)
        used = count_messages(self.conversation)
        carried = any(is_summary(m) for m in self.conversation)
        auto = "" if agent.compaction_policy.auto else " (automatic compaction is off)"
        self.say(
            "\n".join(
                [
                    f"model: {agent.model}",
                    f"window: {window} tokens",
                    f"used: {used} tokens ({_percent(used, window)}%) in "
                    f"{len(self.conversation)} message{'' if len(self.conversation) == 1 else 's'}",
                    f"compacts at: {resolved.at} tokens ({_percent(resolved.at, window)}%){auto}",
                    f"summary carried: {'yes' if carried else 'no'}",
                ]
            )
        )

    async def send(self, text: str) -> None:
        message = {"role": "user", "content": text}
        try:
            outcome = await self.compactor.compact_if_needed(self.conversation, count_message(message))
        except Exception as exc:  # noqa: BLE001 - the message still goes out uncompacted
            self.say(f"(compaction failed: {type(exc).__name__}: {exc})")
        else:
            if outcome.stage != "none" or (outcome.reason and outcome.reason != AUTO_OFF):
                self.say(outcome.sentence())
            self._keep(outcome)
        self.conversation.append(message)
        parts: list[str] = []
        try:
            async with contextlib.aclosing(self._answer()) as pieces:
                async for piece in pieces:
                    parts.append(piece)
                    self.out.write(piece)
                    self.out.flush()
        except HookbusError as exc:
            self.conversation.pop()
            self.say(f"{chr(10) if parts else ''}error {exc.status_code} {exc.code}: {exc.message}")
            return
        except Exception as exc:  # noqa: BLE001 - keep the REPL alive
            self.conversation.pop()
            self.say(f"{chr(10) if parts else ''}error: {type(exc).__name__}: {exc}")
            return
        self.say("")
        self.conversation.append({"role": "assistant", "content": "".join(parts)})

    async def _answer(self) -> AsyncGenerator[str, None]:
        """The answer's text pieces as they stream."""
        if isinstance(self.target, Agent):
            stream = self.target.run_stream(self.conversation, session_id=self.session_id)
        else:
            stream = self.target.stream(self.conversation, session_id=self.session_id)
        generator = cast(AsyncGenerator[ChatCompletionChunk, None], stream)  # both are generators
        async with contextlib.aclosing(generator) as chunks:
            async for chunk in chunks:
                if chunk.choices and chunk.choices[0].delta.content:
                    yield chunk.choices[0].delta.content

    # --------------------------------------------------------------- helpers

    def _keep(self, outcome: Compaction) -> None:
        if outcome.stage != "none":
            self.conversation = [dict(m) for m in outcome.messages]

    def _fresh(self) -> list[dict[str, Any]]:
        instructions = self.compactor.instructions if self.local else None
        return [{"role": "system", "content": instructions}] if instructions else []

    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()


async def _readline(stream: IO[str]) -> str:
    """One line from a blocking stream without blocking the event loop.

    A daemon thread per read, so an interrupted chat never waits at exit for a read
    that will not come.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[str] = loop.create_future()

    def settle(value: str | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value or "")

    def read() -> None:
        try:
            line, error = stream.readline(), None
        except Exception as exc:  # noqa: BLE001 - handed to the awaiting task
            line, error = "", exc
        with contextlib.suppress(RuntimeError):  # the loop may be gone already
            loop.call_soon_threadsafe(settle, line, error)

    threading.Thread(target=read, name="hookbus-chat-input", daemon=True).start()
    return await future


def _percent(part: int, whole: int) -> int:
    return round(100 * part / whole) if whole else 0


def _session_id() -> str:
    return f"chat-{uuid.uuid4().hex[:12]}"


# ---------------------------------------------------------------- entry point


def build_local_agent(redis_url: str | None = None) -> tuple[Agent, list[Any]]:
    """The `--local` agent: built-in SecuritySkill, and MemorySkill when there is a Redis.

    Returns the agent and the memory skills to close at the end.
    """
    from hookbus.skills.builtin import MemorySkill, SecuritySkill

    settings = get_settings()
    skills: list[Any] = [SecuritySkill()]
    memory = []
    if redis_url:
        memory.append(MemorySkill(redis_url=redis_url, prefix=settings.prefix))
    agent = Agent(
        "chat",
        instructions="You are a helpful assistant.",
        skills=[*skills, *memory],
    )
    return agent, memory


async def _main(local: bool) -> int:
    settings = get_settings()
    if local:
        agent, memory = build_local_agent(settings.redis_url)
        try:
            return await chat(agent, local=True)
        finally:
            for skill in memory:
                await skill.close()
    url = run_state.redis_url()
    if not url:
        print(
            "hookbus chat: no Redis to talk to. Set REDIS_URL, start the stack with "
            "`hookbus run`, or chat in-process with `hookbus chat --local`.",
            file=sys.stderr,
        )
        return 2
    from hookbus.skills.builtin import MemorySkill

    memory_skill = MemorySkill(redis_url=url, prefix=settings.prefix)
    compactor = Agent("chat", skills=[memory_skill])
    try:
        async with HookbusClient(url) as client:
            return await chat(client, local=False, compactor=compactor)
    finally:
        await memory_skill.close()


def run_chat(local: bool) -> int:
    """`hookbus chat [--local]`: build the agent or the client from the settings and chat.

    Logs go to stderr at `warning` unless HOOKBUS_LOG_LEVEL says otherwise. Exit status:
    0 at /quit or end of input, 2 without a Redis for the queue mode, 130 on Ctrl-C.
    """
    from hookbus.services.observability.logs import configure_logging

    configure_logging(level=os.environ.get("HOOKBUS_LOG_LEVEL") or "warning")
    try:
        return asyncio.run(_main(local))
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
