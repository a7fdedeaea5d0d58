"""A Qwen3-like chat template with variables, on the tiny byte-level tokenizer (one id per ASCII character,
<|im_start|> 2, <|im_end|> 3), for the tests of data.chat_template_kwargs: each expected token list is written by
hand from the text below, not by rendering the template.

- ``enable_thinking=false`` opens every assistant turn with an empty think block, ``<think>\\n\\n</think>\\n\\n``
  (Qwen3 writes it after the generation prompt only; here the rendered assistant turns carry it too, so the
  template stays prefix-stable and SFT conversations and agent turns can be cut out of the whole).
- ``reasoning_effort=X`` (gpt-oss's variable) adds a first system block ``Reasoning: X``.
- ``tools`` (OpenAI-style schemas) adds a system block of their names, as the tiny template does.
"""

from __future__ import annotations

from tandem.models.tiny import build_tokenizer

from .data_helpers import char_ids

THINK = "<think>\n\n</think>\n\n"

THINKING_TEMPLATE = (
    "{%- if reasoning_effort is defined -%}"
    "{{ '<|im_start|>system\\nReasoning: ' + reasoning_effort + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- if tools -%}"
    "{{ '<|im_start|>system\\ntools: ' }}"
    "{%- for tool in tools -%}{{ tool['function']['name'] }}{{ ',' if not loop.last else '' }}{%- endfor -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- set think = '<think>\\n\\n</think>\\n\\n' if enable_thinking is defined and enable_thinking is false "
    "else '' -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '<|im_start|>assistant\\n' + think + message['content'] + '<|im_end|>\\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' + think }}{%- endif -%}"
)

NO_THINKING = {"enable_thinking": False}


def thinking_tokenizer():
    tokenizer = build_tokenizer()
    tokenizer.chat_template = THINKING_TEMPLATE
    return tokenizer


def block(role: str, content: str) -> list[int]:
    """``<|im_start|>{role}\\n{content}<|im_end|>\\n``."""
    return [2, *char_ids(f"{role}\n{content}"), 3, *char_ids("\n")]


def opening(think: bool) -> list[int]:
    """The generation prompt: ``<|im_start|>assistant\\n``, then the empty think block when thinking is off."""
    return [2, *char_ids("assistant\n" + (THINK if think else ""))]


def prompt_ids(content: str, *, no_thinking: bool) -> list[int]:
    """A one-message user prompt with its generation prompt."""
    return [*block("user", content), *opening(no_thinking)]
