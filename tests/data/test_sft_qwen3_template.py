"""SFT conversations under a Qwen3-style chat template: it renders an assistant turn with an (empty) think block
only after the last user message, and earlier ones without it; with enable_thinking=false its generation
prompt holds the empty think block. No rendering of a growing conversation then starts with the one before
(the turn-by-turn cut fails), so SFTDataset cuts the turns out of the whole rendering. The template is written
here (no hub download), after the behaviour of Qwen3's; expected ids and masks are written by hand."""

from __future__ import annotations

import pytest

from tandem.data import DataError, SFTDataset
from tandem.models.tiny import build_tokenizer

from .data_helpers import char_ids, write_jsonl
from .thinking_template import THINK, block

IM_END = 3
QWEN3_STYLE = (
    "{%- set ns = namespace(last_user=messages|length - 1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' and loop.index0 > ns.last_user -%}"
    "{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- else -%}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif -%}{%- endif -%}"
)
TWO_TURNS = [
    {"role": "user", "content": "1+1="},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "2+2="},
    {"role": "assistant", "content": "4"},
]


@pytest.fixture
def qwen3_style():
    tokenizer = build_tokenizer()
    tokenizer.chat_template = QWEN3_STYLE
    return tokenizer


@pytest.mark.parametrize("thinking", [{"enable_thinking": False}, None])
def test_a_multi_turn_conversation_is_cut_out_of_its_whole_rendering(tmp_path, qwen3_style, thinking):
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": TWO_TURNS}])
    item = SFTDataset(
        path, qwen3_style, max_length=256, stop_token_ids=[IM_END], chat_template_kwargs=thinking
    )[0]
    # the whole rendering: the first turn without a think block (a user message follows), the last with it
    first_context = [*block("user", "1+1="), 2, *char_ids("assistant\n")]
    second_context = [*char_ids("\n"), *block("user", "2+2="), 2, *char_ids("assistant\n" + THINK)]
    assert item["input_ids"] == [
        *first_context,
        *char_ids("2"),
        IM_END,
        *second_context,
        *char_ids("4"),
        IM_END,
        *char_ids("\n"),
    ]
    # each turn trained from its content to its stop token; the last turn's think block is the generation
    # prompt's under enable_thinking=false (not trained), and part of the turn as rendered otherwise (trained)
    think = len(char_ids(THINK))
    trained_think = 0 if thinking else think
    second = [0] * (len(second_context) - trained_think) + [1] * trained_think
    assert item["loss_mask"] == [0] * len(first_context) + [1, 1] + second + [1, 1, 0]


def test_a_one_turn_conversation_and_a_pair_train_the_answer_after_the_empty_think_block(
    tmp_path, qwen3_style
):
    rows = [{"messages": TWO_TURNS[:2]}, {"prompt": TWO_TURNS[:1], "response": "2"}]
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    data = SFTDataset(
        path,
        qwen3_style,
        max_length=256,
        stop_token_ids=[IM_END],
        chat_template_kwargs={"enable_thinking": False},
    )
    prompt = [*block("user", "1+1="), 2, *char_ids("assistant\n" + THINK)]
    assert data[0]["input_ids"] == [*prompt, *char_ids("2"), IM_END, *char_ids("\n")]
    assert data[0]["loss_mask"] == [0] * len(prompt) + [1, 1, 0]
    assert data[1]["input_ids"] == [*prompt, *char_ids("2"), 1]  # the pair's response and EOS
    assert data[1]["loss_mask"] == [0] * len(prompt) + [1, 1]


def test_the_whole_turn_mask_still_needs_a_prefix_stable_template(tmp_path, qwen3_style):
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": TWO_TURNS}])
    with pytest.raises(
        DataError, match=r"message 3: the chat template is not prefix-stable.*data.sft_loss_mask=stop"
    ):
        SFTDataset(path, qwen3_style, max_length=256, loss_mask="turn")
