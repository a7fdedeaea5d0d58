"""data.chat_template_kwargs in the datasets: the RL prompts, SFT pairs and conversations and `tandem generate`'s
prompts are rendered with the template's variables, token for token as written by hand (tests/data/
thinking_template.py), and the right cut keeps the generation prompt the variables change."""

from __future__ import annotations

import pytest

from tandem.data import DataError, PromptDataset, SFTDataset
from tandem.data.generation import generation_items
from tandem.models.tiny import build_tokenizer

from .data_helpers import char_ids, chat_row, write_jsonl
from .thinking_template import NO_THINKING, block, opening, prompt_ids, thinking_tokenizer

EOS = 1


@pytest.fixture(scope="module")
def thinking():
    return thinking_tokenizer()


def test_rl_prompts_carry_the_template_variables(tmp_path, thinking):
    path = write_jsonl(tmp_path / "p.jsonl", [chat_row("1+2="), chat_row("10+5=")])
    off = PromptDataset(path, thinking, max_prompt_length=64, chat_template_kwargs=NO_THINKING)
    assert [off[i]["input_ids"] for i in range(2)] == [
        prompt_ids("1+2=", no_thinking=True),
        prompt_ids("10+5=", no_thinking=True),
    ]
    assert PromptDataset(path, thinking, max_prompt_length=64)[0]["input_ids"] == prompt_ids(
        "1+2=", no_thinking=False
    )
    effort = PromptDataset(
        path, thinking, max_prompt_length=64, chat_template_kwargs={"reasoning_effort": "low"}
    )
    assert effort[0]["input_ids"] == [
        *block("system", "Reasoning: low"),
        *prompt_ids("1+2=", no_thinking=False),
    ]
    # what the start-up round-trip check reads is the same rendering
    assert off.sample_texts[0][1].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_right_truncation_keeps_the_generation_prompt_with_its_think_block(tmp_path, thinking):
    path = write_jsonl(tmp_path / "p.jsonl", [chat_row("0123456789" * 4)])
    cut = PromptDataset(
        path, thinking, max_prompt_length=40, truncation="right", chat_template_kwargs=NO_THINKING
    )
    whole = prompt_ids("0123456789" * 4, no_thinking=True)
    end = opening(True)  # 30 tokens: <|im_start|>assistant\n<think>\n\n</think>\n\n
    assert cut[0]["input_ids"] == [*whole[: 40 - len(end)], *end]
    assert cut.report["truncated"] == 1


def test_sft_pair_prompt_has_the_think_block_untrained(tmp_path, thinking):
    path = write_jsonl(tmp_path / "s.jsonl", [{**chat_row("1+2="), "response": "3"}])
    dataset = SFTDataset(path, thinking, max_length=96, chat_template_kwargs=NO_THINKING)
    prompt = prompt_ids("1+2=", no_thinking=True)
    assert dataset[0] == {
        "input_ids": [*prompt, *char_ids("3"), EOS],
        "loss_mask": [0] * len(prompt) + [1, 1],
    }


def test_sft_conversation_turns_open_with_the_think_block_untrained(tmp_path, thinking):
    messages = [
        {"role": "user", "content": "1+2="},
        {"role": "assistant", "content": "3"},
        {"role": "user", "content": "+4="},
        {"role": "assistant", "content": "7"},
    ]
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": messages}])
    im_end = thinking.convert_tokens_to_ids("<|im_end|>")
    dataset = SFTDataset(
        path, thinking, max_length=160, chat_template_kwargs=NO_THINKING, stop_token_ids=[im_end]
    )
    first = [*block("user", "1+2="), *opening(True)]
    second = [*char_ids("\n"), *block("user", "+4="), *opening(True)]
    assert dataset[0]["input_ids"] == [*first, *char_ids("3"), 3, *second, *char_ids("7"), 3, *char_ids("\n")]
    # trained: each reply and the <|im_end|> that ends it; the headers, think blocks and the rest are not
    assert dataset[0]["loss_mask"] == [0] * len(first) + [1, 1] + [0] * len(second) + [1, 1, 0]


def test_generate_prompts_carry_the_template_variables(tmp_path, thinking):
    path = write_jsonl(tmp_path / "g.jsonl", [{"prompt": [{"role": "user", "content": "5*5="}]}])
    (item,) = generation_items(path, thinking, max_prompt_length=64, chat_template_kwargs=NO_THINKING)
    assert item["input_ids"] == prompt_ids("5*5=", no_thinking=True)
    (cut,) = generation_items(
        path, thinking, max_prompt_length=34, truncation="right", chat_template_kwargs=NO_THINKING
    )
    assert cut["input_ids"] == [*prompt_ids("5*5=", no_thinking=True)[:4], *opening(True)]


def test_variables_without_a_template_to_read_them_are_an_error(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [chat_row("1+2=")])
    tokenizer = build_tokenizer()
    with pytest.raises(DataError, match="chat_template=plain renders prompts as plain text"):
        PromptDataset(
            path, tokenizer, max_prompt_length=64, chat_template="plain", chat_template_kwargs=NO_THINKING
        )
    tokenizer.chat_template = None
    with pytest.raises(DataError, match=r"chat_template=auto .* \(the tokenizer has no chat template\)"):
        SFTDataset(path, tokenizer, max_length=64, chat_template_kwargs=NO_THINKING)
