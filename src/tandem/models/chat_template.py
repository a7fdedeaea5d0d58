"""Rendering a chat with the tokenizer's chat template, in one place for every part of Tandem that does it: the
RL prompts (training and validation), the SFT rows, `tandem generate`'s prompts and the agent loop's inserted
turns. Each passes the run's template arguments (`data.chat_template_kwargs`, verl's
data.apply_chat_template_kwargs: Qwen3's `enable_thinking`, gpt-oss's `reasoning_effort`), so the prompt the
rollout engine continues, the tokens the trainer scores and the turns the agent loop inserts come from one
rendering.

Imports nothing heavy: the config checks read `template_kwargs_problems` before torch or transformers load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The arguments tokenizer.apply_chat_template takes itself (transformers 5's signature): Tandem sets or leaves them
# (the messages, the tools, the generation prompt, text out), so they are no template variables to pass.
# tests/models/test_chat_template.py fails when transformers' signature changes.
CALL_ARGUMENTS = frozenset(
    {
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
SCALARS = (str, bool, int, float, type(None))


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    generation_prompt: bool,
    tools: list[dict] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The chat template's text for ``messages``.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        messages: ``[{"role": ..., "content": ...}, ...]``.
        generation_prompt: end with the opening of the assistant's turn (the template's generation prompt).
        tools: OpenAI-style tool schemas the template declares; None or empty: none.
        template_kwargs: the template's own variables (``{"enable_thinking": False}``), checked by
            `template_kwargs_problems` when the config loaded.

    Returns:
        The rendered text (not tokenized: callers tokenize without the tokenizer's own special tokens).
    """
    extra = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt, **extra, **(template_kwargs or {})
    )


def template_kwargs_problems(key: str, value: Any) -> list[str]:
    """What is wrong with ``value`` as the chat template's arguments set by config key ``key``: it must map
    names to scalars (text, numbers, true / false, null), none of them an argument of apply_chat_template
    itself. [] when it is fine."""
    example = f"{key}.enable_thinking=false"
    if not isinstance(value, Mapping):
        return [
            f"{key} must map the chat template's variables to values, e.g. {example}; got "
            f"{type(value).__name__} {value!r}"
        ]
    problems = []
    for name, item in value.items():
        if not isinstance(name, str) or not name.isidentifier():
            problems.append(f"{key}: {name!r} is no variable name of a template; e.g. {example}")
        elif name in CALL_ARGUMENTS:
            problems.append(
                f"{key}.{name}: {name} is an argument of apply_chat_template that Tandem sets itself (the "
                "messages, tools, generation prompt); give only the template's own variables, e.g. enable_thinking"
            )
        elif not isinstance(item, SCALARS):
            problems.append(
                f"{key}.{name}: a template variable here is text, a number, true / false or null, not "
                f"{type(item).__name__} {item!r}"
            )
    return problems
