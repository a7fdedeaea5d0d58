"""A user's Dataset class (verl's data.custom_cls): its items as the prompt rows, and its errors named by file,
line and item. The classes are real files run by the real loader; the tokenizer is the tiny one."""

from __future__ import annotations

import textwrap

import pytest

from tandem.config import load_config
from tandem.data import DataError, PromptDataset
from tandem.data.user_dataset import dataset_config, row_of_item, rows_from_class

from .data_helpers import chat_ids, chat_row, write_jsonl

# reads a jsonl file itself and rewrites every row as verl's RLHFDataset.__getitem__ returns it: the question
# doubled into raw_prompt, verl's derived fields (tensors, index) and top-level tools_kwargs beside
VERL_STYLE = """\
import json

import torch
from torch.utils.data import Dataset


class Doubled(Dataset):
    def __init__(self, data_files, tokenizer, config, processor=None, max_samples=-1):
        self.rows = [json.loads(line) for path in data_files for line in open(path)]
        self.seen = (tokenizer, config, processor, max_samples)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        row = dict(self.rows[i])
        question = row["prompt"][0]["content"]
        row["raw_prompt"] = [{"role": "user", "content": question + question}]
        row["input_ids"] = torch.tensor([9, 9, 9])
        row["dummy_tensor"] = torch.tensor([0], dtype=torch.uint8)
        row["index"] = 1000 + i
        row["tools_kwargs"] = {"calc": {"create_kwargs": {"seed": i}}}
        row["interaction_kwargs"] = {}
        return row
"""


def user_file(tmp_path, text: str, name: str = "my_data.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def rows(path, name: str, files, tokenizer, config=None, **keys):
    return rows_from_class(
        str(path),
        name,
        [str(f) for f in files],
        tokenizer=tokenizer,
        processor=None,
        config=config,
        files_key="data.train_files",
        prompt_key=keys.get("prompt_key", "prompt"),
        image_key="images",
    )


def test_the_items_of_a_verl_style_class_become_the_prompts(tmp_path, tokenizer):
    data = write_jsonl(tmp_path / "p.jsonl", [chat_row("1+2=", ground_truth="3", index=7), chat_row("4+4=")])
    cls = user_file(tmp_path, VERL_STYLE)
    cfg = load_config("grpo", [f"data.custom_dataset_file={cls}", "data.custom_dataset_class=Doubled"])
    made = rows(cls, "Doubled", [data], tokenizer, dataset_config(cfg.data))
    dataset = PromptDataset([str(data)], tokenizer, max_prompt_length=64, user_rows=made)
    assert dataset.locations == [f"data.train_files: item {i} of Doubled ({cls})" for i in (0, 1)]
    assert dataset[0] == {
        "input_ids": chat_ids("1+2=1+2="),  # rendered from raw_prompt; the item's own input_ids not read
        "raw_prompt": [{"role": "user", "content": "1+2=1+2="}],
        "data_source": "addition",
        "ground_truth": "3",
        # the top-level tools_kwargs go into extra_info; the empty interaction_kwargs add nothing
        "extra_info": {
            "index": 7,
            "split": "train",
            "tools_kwargs": {"calc": {"create_kwargs": {"seed": 0}}},
        },
        "index": 7,  # extra_info.index, not the item's top-level index (verl derives that one from it)
        "agent_name": None,
    }
    assert dataset[1]["input_ids"] == chat_ids("4+4=4+4=") and dataset[1]["index"] == 1  # no extra_info.index
    assert dataset.unread_fields == {}  # verl's derived fields are dropped quietly


def test_the_class_gets_the_files_tokenizer_and_verl_named_config(tmp_path, tokenizer):
    data = write_jsonl(tmp_path / "p.jsonl", [chat_row("1+2=")])
    cls = user_file(
        tmp_path,
        """\
        from torch.utils.data import Dataset

        SEEN = {}


        class Echo(Dataset):
            def __init__(self, data_files, tokenizer, config, processor=None):
                SEEN.update(files=data_files, tokenizer=tokenizer, config=config, processor=processor)

            def __len__(self):
                return 1

            def __getitem__(self, i):
                return {"prompt": [{"role": "user", "content": "hi"}], "data_source": "addition"}
        """,
    )
    cfg = load_config(
        "grpo",
        [
            f"data.custom_dataset_file={cls}",
            "data.custom_dataset_class=Echo",
            "data.truncation=filter",
            "data.max_prompt_length=48",
            "data.prompt_key=prompt",
        ],
    )
    (made,) = rows(cls, "Echo", [data], tokenizer, dataset_config(cfg.data))
    assert made[1] == {"prompt": [{"role": "user", "content": "hi"}], "data_source": "addition"}
    import sys

    (module,) = [
        m for n, m in sys.modules.items() if n.startswith("tandem_user_dataset_") and hasattr(m, "SEEN")
    ]
    seen = module.SEEN
    assert seen["files"] == [str(data)] and seen["tokenizer"] is tokenizer and seen["processor"] is None
    config = seen["config"]  # verl's names: what verl's own RLHFDataset reads with config.get
    assert config.get("prompt_key") == "prompt" and config.max_prompt_length == 48
    assert config.filter_overlong_prompts is True and config.truncation == "error"
    assert config.custom_cls.path == str(cls) and config.custom_cls.name == "Echo"
    assert config.return_raw_chat is True


def test_verl_content_items_become_image_markers_and_the_images_field():
    item = {
        "raw_prompt": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "how many? "},
                    {"type": "image", "image": b"PNG1"},
                    {"type": "image", "bytes": b"PNG2"},
                ],
            },
        ],
        "data_source": "count",
        "prompt": "the source column, replaced by raw_prompt",
    }
    row = row_of_item("item 0", item, "prompt", "images")
    assert row == {
        "prompt": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "how many? <image><image>"},
        ],
        "images": [b"PNG1", {"bytes": b"PNG2"}],
        "data_source": "count",
    }


def test_a_pandas_row_with_numpy_arrays_reads_as_lists():
    np = pytest.importorskip("numpy")
    item = {"prompt": np.array([{"role": "user", "content": "x"}], dtype=object), "data_source": "addition"}
    assert row_of_item("item 0", item, "prompt", "images")["prompt"] == [{"role": "user", "content": "x"}]


GOOD_ITEM = '{"prompt": [{"role": "user", "content": "hi"}], "data_source": "addition"}'
CLASS_HEAD = "from torch.utils.data import Dataset\n\n\nclass Rows(Dataset):\n"


@pytest.mark.parametrize(
    "body, name, expected",
    [
        ("def broken(:\n    pass\n", "Rows", "SyntaxError: invalid syntax at line 1"),
        ("class Other:\n    pass\n", "Rows", "the module has no 'Rows' (classes in it: Other)"),
        (
            "\n\nclass Rows:\n    pass\n",
            "Rows",
            "class 'Rows' ({file} line 3) is not a torch.utils.data.Dataset",
        ),
        (
            "from torch.utils.data import IterableDataset\n\n\nclass Rows(IterableDataset):\n    pass\n",
            "Rows",
            "class 'Rows' ({file} line 4) is an IterableDataset",
        ),
        (
            CLASS_HEAD + "    def __init__(self, data_files, tokenizer, config, processor=None):\n"
            "        raise KeyError('question')\n",
            "Rows",
            "building it on data.train_files=",
        ),
    ],
    ids=["syntax", "missing class", "not a Dataset", "iterable", "constructor raises"],
)
def test_a_broken_class_names_the_file_and_line(tmp_path, tokenizer, body, name, expected):
    cls = user_file(tmp_path, body)
    with pytest.raises(DataError) as error:
        rows(cls, name, [tmp_path / "p.jsonl"], tokenizer)
    message = str(error.value)
    assert message.startswith(f"data.custom_dataset_class='{name}' in data.custom_dataset_file='{cls}': ")
    assert expected.format(file=cls) in message
    if "constructor" in message or "building" in message:
        assert "KeyError: 'question' (line 6)" in message


@pytest.mark.parametrize(
    "getitem, expected",
    [
        (
            "return " + GOOD_ITEM + " if i == 0 else 1 / 0",
            "item 1 of Rows ({file}): __getitem__ failed: ZeroDivisionError: division by zero (line 12)",
        ),
        (
            "return [1, 2]",
            "item 0 of Rows ({file}): __getitem__ returned a list; it must return one row, a dict",
        ),
        (
            "return {'data_source': 'addition', 'extra_info': {}}",
            "item 0 of Rows ({file}): missing field 'raw_prompt' (the chat messages; or 'prompt', data.prompt_key) "
            "(fields present: data_source, extra_info)",
        ),
        (
            "return {'raw_prompt': [{'role': 'user', 'content': 'hi'}], 'reward_model': {'ground_truth': '1'}}",
            "item 0 of Rows ({file}): missing field 'data_source' (fields present: prompt, reward_model).",
        ),
        (
            "return {'raw_prompt': [{'role': 'user', 'content': 'hi'}], 'data_source': 'a', 'extra_info': 'x'}",
            "item 0 of Rows ({file}): field 'extra_info' must be an object (dict) when given, got str",
        ),
    ],
    ids=["getitem raises", "not a dict", "no prompt", "no data_source", "extra_info not a dict"],
)
def test_a_bad_item_names_its_index_and_field(tmp_path, tokenizer, getitem, expected):
    cls = user_file(
        tmp_path,
        CLASS_HEAD
        + "    def __init__(self, data_files, tokenizer, config, processor=None):\n        pass\n\n"
        + "    def __len__(self):\n        return 2\n\n"
        + f"    def __getitem__(self, i):\n        {getitem}\n",
    )
    with pytest.raises(DataError) as error:
        made = rows(cls, "Rows", [tmp_path / "p.jsonl"], tokenizer)
        PromptDataset([str(tmp_path / "p.jsonl")], tokenizer, max_prompt_length=64, user_rows=made)
    assert str(error.value).startswith("data.train_files: " + expected.format(file=cls))


def test_an_empty_class_is_an_error(tmp_path, tokenizer):
    cls = user_file(
        tmp_path,
        CLASS_HEAD
        + "    def __init__(self, **kw):\n        pass\n\n    def __len__(self):\n        return 0\n",
    )
    with pytest.raises(DataError, match=r"built on data.train_files=\[.*\], it holds no items"):
        rows(cls, "Rows", [tmp_path / "p.jsonl"], tokenizer)


def test_verl_keys_map_onto_the_dataset_keys_and_the_file_is_checked(tmp_path):
    cls = user_file(tmp_path, VERL_STYLE)
    cfg = load_config("verl", [f"data.custom_cls.path={cls}", "data.custom_cls.name=Doubled"], on_verl=print)
    assert (cfg.data.custom_dataset_file, cfg.data.custom_dataset_class) == (str(cls), "Doubled")
    from tandem.config import ConfigError

    with pytest.raises(ConfigError, match=r"data.custom_dataset_file: '.*nowhere.py' does not exist"):
        load_config(
            "grpo", [f"data.custom_dataset_file={tmp_path / 'nowhere.py'}", "data.custom_dataset_class=X"]
        )
    with pytest.raises(ConfigError, match=r"data.custom_dataset_file=.* needs data.custom_dataset_class"):
        load_config("grpo", [f"data.custom_dataset_file={cls}"])
