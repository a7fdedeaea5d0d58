import pytest
import torch

from tandem.data import DataError, PromptDataset, SFTDataset, collate_sft
from tandem.data.synthetic import make_rows, write_task

from .data_helpers import char_ids, chat_ids, chat_row, write_jsonl

EOS = 1


def sft_row(content: str, response: str) -> dict:
    return {**chat_row(content), "response": response}


def test_loss_mask_exact_on_hand_made_example(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "s.jsonl", [sft_row("1+2=", "3"), sft_row("10+5=", "15")])
    dataset = SFTDataset(path, tokenizer, max_length=64)
    prompt = chat_ids("1+2=")  # 23 tokens ending in "<|im_start|>assistant\n"
    assert dataset[0] == {"input_ids": [*prompt, *char_ids("3"), EOS], "loss_mask": [0] * 23 + [1, 1]}
    assert dataset[1]["input_ids"] == [*chat_ids("10+5="), *char_ids("15"), EOS]
    assert dataset[1]["loss_mask"] == [0] * 24 + [1, 1, 1]
    assert dataset.report == {"total": 2, "kept": 2, "filtered": 0, "truncated": 0}


def test_prompt_tokens_match_the_rl_prompt_dataset(tmp_path, tokenizer):
    path = write_task("countdown", tmp_path / "c.parquet", 8, seed=1)
    sft = SFTDataset(path, tokenizer, max_length=256)
    prompts = PromptDataset(path, tokenizer, max_prompt_length=256)
    rows = make_rows("countdown", 8, seed=1)
    for i in range(8):
        n = len(prompts[i]["input_ids"])
        assert sft[i]["input_ids"][:n] == prompts[i]["input_ids"]
        assert sft[i]["loss_mask"] == [0] * n + [1] * (len(sft[i]["input_ids"]) - n)
        assert tokenizer.decode(sft[i]["input_ids"][n:]) == rows[i]["response"] + "<|endoftext|>"


def test_plain_template(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "s.jsonl", [sft_row("7+1=", "8")])
    item = SFTDataset(path, tokenizer, max_length=64, chat_template="plain")[0]
    assert item == {"input_ids": [*char_ids("7+1=8"), EOS], "loss_mask": [0, 0, 0, 0, 1, 1]}


def test_right_truncation_and_filter(tmp_path, tokenizer):
    rows = [sft_row("ab", "cdef"), sft_row("abcde", "f"), sft_row("a", "b")]
    path = write_jsonl(tmp_path / "s.jsonl", rows)
    dataset = SFTDataset(path, tokenizer, max_length=5, truncation="right", chat_template="plain")
    assert dataset.report == {"total": 3, "kept": 2, "filtered": 1, "truncated": 1}
    assert dataset[0] == {"input_ids": char_ids("abcde"), "loss_mask": [0, 0, 1, 1, 1]}  # EOS cut off
    assert dataset[1] == {"input_ids": [*char_ids("ab"), EOS], "loss_mask": [0, 1, 1]}
    with pytest.raises(DataError) as err:
        SFTDataset(path, tokenizer, max_length=5, chat_template="plain")
    assert f"{path} row 0 (line 1)" in str(err.value) and "7 tokens" in str(err.value)
    assert "data.max_length=5" in str(err.value)
    with pytest.raises(ValueError, match="data.truncation must be one of"):
        SFTDataset(path, tokenizer, max_length=5, truncation="left")


@pytest.mark.parametrize(
    ("bad", "phrase"),
    [
        ({"prompt": [{"role": "user", "content": "x"}]}, "missing field 'response'"),
        (sft_row("x", "y") | {"response": 3}, "field 'response' must be a str"),
        ({"response": "y"}, "missing field 'prompt'"),
        (
            sft_row("x", "y") | {"prompt": [{"content": "x"}]},
            "field 'prompt' message 0 needs a string 'role'",
        ),
    ],
)
def test_bad_rows_name_file_row_and_field(tmp_path, tokenizer, bad, phrase):
    path = write_jsonl(tmp_path / "s.jsonl", [sft_row("a", "b"), bad])
    with pytest.raises(DataError) as err:
        SFTDataset(path, tokenizer, max_length=64)
    assert str(err.value).startswith(f"{path} row 1 (line 2): ") and phrase in str(err.value)


def test_custom_keys(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "s.jsonl", [{"question": "q", "answer": "a"}])
    item = SFTDataset(
        path, tokenizer, max_length=8, prompt_key="question", response_key="answer", chat_template="none"
    )[0]
    assert item == {"input_ids": [*char_ids("qa"), EOS], "loss_mask": [0, 1, 1]}


def test_collate_right_pads_exactly():
    items = [
        {"input_ids": [5, 6, 7, 1], "loss_mask": [0, 0, 1, 1]},
        {"input_ids": [8, 1], "loss_mask": [0, 1]},
    ]
    batch = collate_sft(items, pad_token_id=0)
    assert len(batch) == 2
    assert torch.equal(batch["input_ids"], torch.tensor([[5, 6, 7, 1], [8, 1, 0, 0]]))
    assert torch.equal(batch["attention_mask"], torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]))
    assert torch.equal(batch["position_ids"], torch.tensor([[0, 1, 2, 3], [0, 1, 1, 1]]))
    assert torch.equal(batch["loss_mask"], torch.tensor([[0, 0, 1, 1], [0, 1, 0, 0]]))
