import json
import logging

import numpy as np
import pytest
import torch

from tandem.batch import Batch
from tandem.data import DataError, PromptDataset, collate_prompts
from tandem.data.synthetic import write_rows, write_task
from tandem.models.tiny import build_tokenizer

from .data_helpers import char_ids, chat_ids, chat_row, write_jsonl


@pytest.fixture
def three_lengths(tmp_path):
    rows = [chat_row("abc", index=10), chat_row("abcdef", index=11), chat_row("abcdefghij", index=12)]
    return write_jsonl(tmp_path / "p.jsonl", rows)


def test_chat_rendering_gives_exact_ids_and_fields(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "p.jsonl", [chat_row("1+2=", ground_truth="3", index=7)])
    dataset = PromptDataset(path, tokenizer, max_prompt_length=64)
    assert len(dataset) == 1
    assert dataset[0] == {
        "input_ids": chat_ids("1+2="),
        "raw_prompt": [{"role": "user", "content": "1+2="}],
        "data_source": "addition",
        "ground_truth": "3",
        "extra_info": {"index": 7, "split": "train"},
        "index": 7,
        "agent_name": None,  # verl's per-row agent loop; the row names none
    }
    assert len(chat_ids("1+2=")) == 23


def test_plain_and_auto_without_template(tmp_path):
    rows = [
        {
            "prompt": [{"role": "system", "content": "hi"}, {"role": "user", "content": "2+2="}],
            "data_source": "d",
        }
    ]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    no_template = build_tokenizer()
    no_template.chat_template = None
    for tok, mode in ((build_tokenizer(), "plain"), (no_template, "auto")):
        item = PromptDataset(path, tok, max_prompt_length=64, chat_template=mode)[0]
        assert item["input_ids"] == char_ids("hi\n2+2=")
        # no reward_model / extra_info: ground truth None, index = position in the files
        assert (item["ground_truth"], item["extra_info"], item["index"]) == (None, {}, 0)


def test_chat_template_none_takes_text_as_is(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Q: 1+1\nA:", "data_source": "d"}])
    item = PromptDataset(path, tokenizer, max_prompt_length=64, chat_template="none")[0]
    assert item["input_ids"] == char_ids("Q: 1+1\nA:") and item["raw_prompt"] == "Q: 1+1\nA:"
    with pytest.raises(ValueError, match=r"data\.chat_template must be one of"):
        PromptDataset(path, tokenizer, max_prompt_length=64, chat_template="chatml")


@pytest.mark.parametrize(
    ("truncation", "expected_ids", "report"),
    [
        ("filter", ["abc"], {"total": 3, "kept": 1, "filtered": 2, "truncated": 0}),
        ("left", ["abc", "bcdef", "fghij"], {"total": 3, "kept": 3, "filtered": 0, "truncated": 2}),
        ("right", ["abc", "abcde", "abcde"], {"total": 3, "kept": 3, "filtered": 0, "truncated": 2}),
    ],
)
def test_truncation_modes(three_lengths, tokenizer, truncation, expected_ids, report, caplog):
    with caplog.at_level(logging.INFO, logger="tandem.data.prompts"):
        dataset = PromptDataset(
            three_lengths, tokenizer, max_prompt_length=5, truncation=truncation, chat_template="plain"
        )
    assert [dataset[i]["input_ids"] for i in range(len(dataset))] == [char_ids(t) for t in expected_ids]
    assert dataset.report == report
    assert [dataset[i]["index"] for i in range(len(dataset))] == [10, 11, 12][: len(dataset)]
    assert len(caplog.records) == 1 and f"{report['kept']} kept" in caplog.records[0].getMessage()


def test_truncation_error_names_row_length_and_key(three_lengths, tokenizer):
    with pytest.raises(DataError) as err:
        PromptDataset(three_lengths, tokenizer, max_prompt_length=5, chat_template="plain")
    message = str(err.value)
    assert f"{three_lengths} row 1 (line 2)" in message
    assert "6 tokens" in message and "data.max_prompt_length=5" in message and "data.truncation" in message
    # exactly at the limit is fine
    assert (
        PromptDataset(three_lengths, tokenizer, max_prompt_length=10, chat_template="plain").report["kept"]
        == 3
    )


def test_everything_filtered_is_an_error(three_lengths, tokenizer):
    with pytest.raises(DataError, match="no prompts left out of 3 rows"):
        PromptDataset(
            three_lengths, tokenizer, max_prompt_length=2, truncation="filter", chat_template="plain"
        )


GOOD = chat_row("1+1=")
BAD_ROWS = {
    "missing prompt": ({"data_source": "d"}, ["missing field 'prompt'", "data.prompt_key"]),
    "prompt is a string": ({**GOOD, "prompt": "1+1="}, ["field 'prompt' must be a list", "got a string"]),
    "prompt is a number": ({**GOOD, "prompt": 5}, ["field 'prompt' must be a list", "got int"]),
    "prompt is empty": ({**GOOD, "prompt": []}, ["field 'prompt' must be a list", "empty list"]),
    "message without content": (
        {**GOOD, "prompt": [{"role": "user"}]},
        ["field 'prompt' message 0", "needs a string 'content'"],
    ),
    "message not a dict": ({**GOOD, "prompt": ["hi"]}, ["field 'prompt' message 0 must be a dict"]),
    "prompt is null": ({**GOOD, "prompt": None}, ["field 'prompt' is null"]),
    "message content is null": (
        {**GOOD, "prompt": [{"role": "user", "content": None}]},
        ["field 'prompt' message 0 needs a string 'content', got null"],
    ),
    "message without role": (
        {**GOOD, "prompt": [{"content": "x"}]},
        ["field 'prompt' message 0 needs a string 'role', got nothing (no such key)"],
    ),
    "data_source is null": ({**GOOD, "data_source": None}, ["field 'data_source' is null"]),
    "missing data_source": ({"prompt": GOOD["prompt"]}, ["missing field 'data_source'"]),
    "data_source not a string": ({**GOOD, "data_source": 3}, ["field 'data_source' must be a str"]),
    "reward_model not a dict": ({**GOOD, "reward_model": "3"}, ["field 'reward_model' must be an object"]),
    "row not an object": ([1, 2], ["a row must be a JSON object"]),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_bad_row_errors_name_file_row_and_field(tmp_path, tokenizer, case):
    bad, phrases = BAD_ROWS[case]
    path = write_jsonl(tmp_path / "bad.jsonl", [GOOD, GOOD, bad])
    with pytest.raises(DataError) as err:
        PromptDataset(path, tokenizer, max_prompt_length=64)
    message = str(err.value)
    assert message.startswith(f"{path} row 2 (line 3): ")
    for phrase in phrases:
        assert phrase in message


def test_bad_row_in_parquet_and_bad_json(tmp_path, tokenizer):
    path = write_rows(
        [GOOD, {**GOOD, "prompt": [{"role": "user", "content": None}]}], tmp_path / "bad.parquet"
    )
    with pytest.raises(
        DataError, match=r"bad\.parquet row 1: field 'prompt' message 0 needs a string 'content'"
    ):
        PromptDataset(path, tokenizer, max_prompt_length=64)
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(GOOD) + '\n\n{"prompt": [\n')
    with pytest.raises(DataError, match=r"broken\.jsonl row 1 \(line 3\): not valid JSON"):
        PromptDataset(broken, tokenizer, max_prompt_length=64)
    for missing, phrase in ((tmp_path / "nope.parquet", "no such file"), (tmp_path / "x.csv", "unsupported")):
        with pytest.raises(DataError, match=phrase):
            PromptDataset(missing, tokenizer, max_prompt_length=64)


def test_jsonl_and_parquet_give_equal_items(tmp_path, tokenizer):
    from_parquet = PromptDataset(
        write_task("countdown", tmp_path / "c.parquet", 12, seed=3), tokenizer, max_prompt_length=128
    )
    from_jsonl = PromptDataset(
        write_task("countdown", tmp_path / "c.jsonl", 12, seed=3), tokenizer, max_prompt_length=128
    )
    assert len(from_parquet) == len(from_jsonl) == 12
    assert [from_parquet[i] for i in range(12)] == [from_jsonl[i] for i in range(12)]
    assert set(from_parquet[0]["ground_truth"]) == {"target", "numbers"}


def test_several_files_and_position_index(tmp_path, tokenizer):
    a = write_jsonl(tmp_path / "a.jsonl", [chat_row("a"), chat_row("b")])
    b = write_jsonl(tmp_path / "b.jsonl", [chat_row("c")])
    dataset = PromptDataset([a, str(b)], tokenizer, max_prompt_length=64, chat_template="plain")
    assert [dataset[i]["input_ids"] for i in range(3)] == [char_ids("a"), char_ids("b"), char_ids("c")]
    assert [dataset[i]["index"] for i in range(3)] == [0, 1, 2]


def test_collate_left_pads_exactly():
    items = [
        {"input_ids": [5, 6, 7], "raw_prompt": [{"role": "user", "content": "x"}], "data_source": "a",
         "ground_truth": {"target": 3, "numbers": [1, 2]}, "extra_info": {"index": 4}, "index": 4},
        {"input_ids": [8], "raw_prompt": [{"role": "user", "content": "y"}], "data_source": "b",
         "ground_truth": "9", "extra_info": {}, "index": 5},
    ]  # fmt: skip
    batch = collate_prompts(items, pad_token_id=0)
    assert isinstance(batch, Batch) and len(batch) == 2
    assert torch.equal(batch["input_ids"], torch.tensor([[5, 6, 7], [0, 0, 8]]))
    assert torch.equal(batch["attention_mask"], torch.tensor([[1, 1, 1], [0, 0, 1]]))
    assert torch.equal(batch["position_ids"], torch.tensor([[0, 1, 2], [0, 0, 0]]))
    assert batch["input_ids"].dtype == torch.long
    assert batch["data_source"].dtype == object and list(batch["data_source"]) == ["a", "b"]
    assert batch["raw_prompt"].shape == (2,) and batch["raw_prompt"][1] == [{"role": "user", "content": "y"}]
    assert batch["ground_truth"][0] == {"target": 3, "numbers": [1, 2]}
    assert list(batch["index"]) == [4, 5] and batch["extra_info"][0] == {"index": 4}
    assert set(batch.non_tensors) == {"raw_prompt", "data_source", "ground_truth", "extra_info", "index"}


def test_collate_from_dataset_with_pad_id(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "p.jsonl", [chat_row("12"), chat_row("3")])
    dataset = PromptDataset(path, tokenizer, max_prompt_length=64)
    batch = collate_prompts([dataset[0], dataset[1]], pad_token_id=tokenizer.pad_token_id)
    assert batch["input_ids"][1].tolist() == [0, *chat_ids("3")]
    assert batch["position_ids"][1].tolist() == [0, *range(len(chat_ids("3")))]
    assert np.array_equal(batch["data_source"], np.array(["addition", "addition"], dtype=object))


def test_a_null_field_is_called_null_not_missing(tmp_path, tokenizer):
    """A row that has the field with value null (a parquet column with a gap) is not "missing" it."""
    path = write_rows([GOOD, {**GOOD, "prompt": None}], tmp_path / "null.parquet")
    with pytest.raises(DataError) as err:
        PromptDataset(path, tokenizer, max_prompt_length=64)
    assert str(err.value) == (
        f"{path} row 1: field 'prompt' is null; give it a value in every row, or drop the row"
    )


def test_locations_absent_ground_truths_and_sample_texts(tmp_path, tokenizer):
    no_reward_model = {key: value for key, value in chat_row("b").items() if key != "reward_model"}
    rows = [chat_row("a"), no_reward_model, chat_row("c", ground_truth=None), *[chat_row("d")] * 7]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    dataset = PromptDataset(path, tokenizer, max_prompt_length=64)
    assert dataset.locations[:3] == [f"{path} row {i} (line {i + 1})" for i in range(3)]
    assert dataset.ground_truth_absent == {1}  # row 2 has the field, with value null
    assert [dataset[i]["ground_truth"] for i in range(3)] == ["1", None, None]
    assert len(dataset.sample_texts) == 8
    assert dataset.sample_texts[0] == (f"{path} row 0 (line 1)", tokenizer.decode(chat_ids("a")))
