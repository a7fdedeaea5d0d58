"""models/chat_template.py: the one rendering of a chat with the template's variables, and the check of those
variables (data.chat_template_kwargs)."""

from __future__ import annotations

import inspect

import pytest
from transformers import PreTrainedTokenizerBase

from data.thinking_template import NO_THINKING, THINK, thinking_tokenizer
from tandem.models.chat_template import CALL_ARGUMENTS, render_chat, template_kwargs_problems

USER = [{"role": "user", "content": "hi"}]


def test_the_call_arguments_are_transformers_own():
    """Fails when transformers' apply_chat_template gains or loses a named argument: CALL_ARGUMENTS must follow,
    or a template variable of that name would clash with the call (or one would be refused for nothing)."""
    named = {
        name
        for name, parameter in inspect.signature(
            PreTrainedTokenizerBase.apply_chat_template
        ).parameters.items()
        if name != "self" and parameter.kind is not inspect.Parameter.VAR_KEYWORD
    }
    assert named == CALL_ARGUMENTS


def test_render_chat_passes_the_variables_to_the_template():
    tokenizer = thinking_tokenizer()
    plain = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert render_chat(tokenizer, USER, generation_prompt=True) == plain
    assert render_chat(tokenizer, USER, generation_prompt=True, template_kwargs={}) == plain
    assert render_chat(tokenizer, USER, generation_prompt=True, template_kwargs=NO_THINKING) == plain + THINK
    assert (
        render_chat(tokenizer, USER, generation_prompt=True, template_kwargs={"enable_thinking": True})
        == plain
    )
    tools = [{"type": "function", "function": {"name": "calculator"}}]
    both = render_chat(
        tokenizer, USER, generation_prompt=False, tools=tools, template_kwargs={"reasoning_effort": "medium"}
    )
    assert both == (
        "<|im_start|>system\nReasoning: medium<|im_end|>\n<|im_start|>system\ntools: calculator<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n"
    )


def test_good_variables_have_no_problem():
    kwargs = {"enable_thinking": False, "reasoning_effort": "medium", "budget": 3, "t": 0.5, "x": None}
    assert template_kwargs_problems("data.chat_template_kwargs", kwargs) == []
    assert template_kwargs_problems("data.chat_template_kwargs", {}) == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            "enable_thinking=false",
            "data.chat_template_kwargs must map the chat template's variables to values",
        ),
        ({"tools": []}, "data.chat_template_kwargs.tools: tools is an argument of apply_chat_template"),
        (
            {"add_generation_prompt": True},
            "data.chat_template_kwargs.add_generation_prompt: add_generation_prompt",
        ),
        ({"stops": ["a"]}, "data.chat_template_kwargs.stops: a template variable here is text, a number"),
        ({"not a name": 1}, "data.chat_template_kwargs: 'not a name' is no variable name of a template"),
    ],
)
def test_bad_variables_are_named(value, expected):
    (problem,) = template_kwargs_problems("data.chat_template_kwargs", value)
    assert problem.startswith(expected)
