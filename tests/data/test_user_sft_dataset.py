"""A user's Dataset class for `tandem sft` (verl's data.custom_cls in its SFT trainers): built with verl's
arguments, its items read as the SFT rows with verl's loss-mask convention, and a bad item or file named. The
classes are real files run by the real loader; the tokenizer is the tiny one."""

from __future__ import annotations

import textwrap

import pytest
import torch
from omegaconf import ListConfig

from tandem.config import load_config
from tandem.data import DataError, SFTDataset, collate_sft
from tandem.data.user_dataset import load_dataset_class
from tandem.data.user_sft_dataset import UserSFTRows, sft_dataset_config
from tandem.roles.sft import target_mask

from .data_helpers import char_ids, chat_ids, chat_row, write_jsonl

EOS = 1

# verl's SFTDataset item shape, written the way a user would: prompt rendered with the generation prompt,
# response + EOS, right-padded to config.max_length; `loss_mask` 1 on the response tokens and the EOS (token j
# trained), as Tandem's own pair rows train them. SHIFTED: verl's own SFTDataset's mask instead (1 from the last
# prompt token to the token before the EOS).
VERL_STYLE = """\
import json

import torch
from torch.utils.data import Dataset

BUILT_WITH = {}


class Pairs(Dataset):
    def __init__(self, parquet_files, tokenizer, config, max_samples=-1):
        BUILT_WITH.update(files=parquet_files, config=config, max_samples=max_samples)
        self.rows = [json.loads(line) for path in parquet_files for line in open(path)]
        self.tokenizer, self.max_length = tokenizer, config.max_length

    def __len__(self):
        return len(self.rows)

    def item(self, i):
        row, tok = self.rows[i], self.tokenizer
        text = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        response = tok(row["response"] + tok.eos_token, add_special_tokens=False)["input_ids"]
        ids = torch.tensor(prompt + response)
        pad = max(self.max_length - len(ids), 0)
        attention = torch.cat([torch.ones(len(ids), dtype=torch.long), torch.zeros(pad, dtype=torch.long)])
        input_ids = torch.cat([ids, torch.full((pad,), tok.pad_token_id)])
        positions = torch.clamp(torch.cumsum(attention, 0) - 1, min=0)
        return input_ids, attention, positions, len(prompt), len(response)

    def __getitem__(self, i):
        input_ids, attention, positions, p, r = self.item(i)
        loss_mask = torch.zeros_like(attention)
        loss_mask[p : p + r] = 1
        return {"input_ids": input_ids, "attention_mask": attention, "position_ids": positions, "loss_mask": loss_mask}


class Shifted(Pairs):
    def __getitem__(self, i):
        input_ids, attention, positions, p, r = self.item(i)
        loss_mask = attention.clone()
        loss_mask[: p - 1] = 0
        loss_mask[p + r - 1] = 0
        return {"input_ids": input_ids, "attention_mask": attention, "position_ids": positions, "loss_mask": loss_mask}
"""


def sft_row(content: str, response: str) -> dict:
    return {**chat_row(content), "response": response}


def user_file(tmp_path, text: str, name: str = "my_sft.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def user_rows(
    path, name: str, files, tokenizer, max_length: int = 40, truncation: str = "error"
) -> UserSFTRows:
    cfg = load_config("sft", [f"data.custom_dataset_file={path}", f"data.custom_dataset_class={name}"])
    return UserSFTRows(
        str(path),
        name,
        [str(f) for f in files],
        tokenizer=tokenizer,
        processor=None,
        config=sft_dataset_config(cfg.data, max_length),
        files_key="data.train_files",
        max_length=max_length,
        truncation=truncation,
    )


@pytest.fixture
def pairs(tmp_path):
    return write_jsonl(
        tmp_path / "pairs.jsonl", [sft_row("1+2=", "3"), sft_row("10+5=", "15"), sft_row("7+1=", "8")]
    )


def test_a_verl_style_class_gives_the_rows_tandem_makes_of_the_same_pairs(tmp_path, tokenizer, pairs):
    import sys

    path = user_file(tmp_path, VERL_STYLE)
    made = user_rows(path, "Pairs", [pairs], tokenizer)
    built_in = SFTDataset(pairs, tokenizer, max_length=40)
    assert len(made) == len(built_in) == 3
    assert [made[i] for i in range(3)] == [built_in[i] for i in range(3)]
    # by hand: the chat-rendered prompt (23 tokens), "3", EOS; only the response and the EOS trained
    assert made[0] == {"input_ids": [*chat_ids("1+2="), *char_ids("3"), EOS], "loss_mask": [0] * 23 + [1, 1]}
    assert made.report == {"total": 3, "kept": 3, "filtered": 0, "truncated": 0} and made.sample_texts == []
    # verl's arguments: the files as an OmegaConf list, the data section under verl's names, max_samples=-1
    seen = sys.modules[
        load_dataset_class(str(path), "Pairs").__module__
    ].BUILT_WITH  # the module the run loaded
    assert isinstance(seen["files"], ListConfig) and list(seen["files"]) == [str(pairs)]
    assert seen["max_samples"] == -1
    config = seen["config"]
    assert (config.max_length, config.custom_cls.name, config.truncation) == (40, "Pairs", "error")
    assert (config.prompt_key, config.response_key, config.multiturn.messages_key) == (
        "prompt",
        "response",
        "messages",
    )


def test_verls_own_mask_is_read_as_verls_trainers_read_it(tmp_path, tokenizer, pairs):
    """verl's SFTDataset mask (1 from the last prompt token to the token before the EOS): the row keeps it as it
    is, padding dropped, and the tokens Tandem's loss scores are those verl's trainer scores (its loss_mask[:, 1:]
    against labels input_ids[:, 1:]), hand-checked on row 0 and compared on every row."""
    path = user_file(tmp_path, VERL_STYLE)
    made = user_rows(path, "Shifted", [pairs], tokenizer)
    assert made[0]["loss_mask"] == [0] * 22 + [1, 1, 0]  # the prompt's last token and "3" trained; EOS not
    config = sft_dataset_config(load_config("sft", []).data, 40)
    items = load_dataset_class(str(path), "Shifted")(ListConfig([str(pairs)]), tokenizer, config)
    for i in range(3):
        item = items[i]
        verl_labels = item["input_ids"][1:][item["loss_mask"][1:].bool()]  # verl: label j weighted by mask[j]
        batch = collate_sft([made[i]], tokenizer.pad_token_id)
        scored = target_mask(batch["loss_mask"])[0].bool()  # Tandem: position t scores token t + 1
        tandem_labels = batch["input_ids"][0][1:][scored[:-1]]
        assert torch.equal(tandem_labels, verl_labels)


BAD_ITEMS = """\
import torch
from pathlib import Path
from torch.utils.data import Dataset

GOOD = {"input_ids": [5, 6, 7, 0], "attention_mask": [1, 1, 1, 0], "loss_mask": [1, 1, 1, 0]}
BAD = {
    "not_a_dict": [5, 6, 7],
    "no_loss_mask": {"input_ids": [5, 6, 7]},
    "trains_padding": {**GOOD, "loss_mask": [0, 1, 1, 1]},
    "padding_between": {**GOOD, "attention_mask": [1, 0, 1, 1], "loss_mask": [0, 0, 1, 1]},
    "packed": {**GOOD, "position_ids": [0, 1, 0, 0]},
    "nothing_trained": {**GOOD, "loss_mask": [1, 0, 0, 0]},
    "not_a_token": {**GOOD, "input_ids": [5, 6, 999, 0]},
    "batched": {k: torch.tensor([v]) for k, v in GOOD.items()},
    "lengths_differ": {**GOOD, "loss_mask": [0, 1, 1]},
    "mask_not_0_1": {**GOOD, "loss_mask": [0, 2, 1, 0]},
    "images": {**GOOD, "multi_modal_inputs": {"pixel_values": torch.zeros(1)}},
}


class Bad(Dataset):
    def __init__(self, parquet_files, tokenizer, config):
        self.case = Path(parquet_files[0]).stem

    def __len__(self):
        return 3

    def __getitem__(self, i):
        return BAD.get(self.case, GOOD) if i == 1 else GOOD
"""


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("not_a_dict", "__getitem__ returned a list; it must return one SFT item, a dict"),
        ("no_loss_mask", "missing field(s) loss_mask (fields present: input_ids)"),
        ("trains_padding", "'loss_mask' is 1 at position 3, where 'attention_mask' is 0 (padding)"),
        ("padding_between", "'attention_mask' has padding between tokens (0 at position 1)"),
        ("packed", "'position_ids' of the tokens are not 0, 1, 2, ...; Tandem computes the positions itself"),
        ("nothing_trained", "'loss_mask' trains no token"),
        ("not_a_token", "'input_ids' holds 999 at position 2, not a token id of the tokenizer (0 .. 259)"),
        ("batched", "field 'input_ids' has shape [1, 4]; give one 1-D tensor per item"),
        ("lengths_differ", "'loss_mask' has 3 entries, 'input_ids' 4"),
        ("mask_not_0_1", "'loss_mask' holds [0, 1, 2]; it must be 0 / 1 per token"),
        ("images", "holds 'multi_modal_inputs'; Tandem reads no images"),
    ],
)
def test_a_bad_item_is_named_with_its_index_and_what_to_do(tmp_path, tokenizer, case, words):
    path = user_file(tmp_path, BAD_ITEMS)
    with pytest.raises(DataError) as error:
        user_rows(path, "Bad", [write_jsonl(tmp_path / f"{case}.jsonl", [])], tokenizer)
    assert str(error.value).startswith(f"data.train_files: item 1 of Bad ({path}): ")
    assert words in str(error.value)


def test_the_good_item_drops_its_padding_and_the_first_tokens_mask(tmp_path, tokenizer):
    path = user_file(tmp_path, BAD_ITEMS)
    made = user_rows(path, "Bad", [write_jsonl(tmp_path / "none.jsonl", [])], tokenizer)
    assert made[0] == {"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}


def test_errors_in_the_users_file_name_the_file_and_line(tmp_path, tokenizer, pairs):
    broken = user_file(
        tmp_path, "from torch.utils.data import Dataset\n\nclass Pairs(Dataset):\n    def f(:\n"
    )
    with pytest.raises(DataError, match=rf"{broken}.*line 4"):
        user_rows(broken, "Pairs", [pairs], tokenizer)
    raising = user_file(
        tmp_path,
        "from torch.utils.data import Dataset\n\n\nclass Pairs(Dataset):\n"
        "    def __init__(self, parquet_files, tokenizer, config):\n        raise KeyError('response')\n",
        name="raising.py",
    )
    with pytest.raises(DataError) as error:
        user_rows(raising, "Pairs", [pairs], tokenizer)
    message = str(error.value)
    assert f"data.custom_dataset_class='Pairs' in data.custom_dataset_file='{raising}'" in message
    assert "KeyError" in message and "line 6" in message
    assert "Pairs(parquet_files=..., tokenizer=..., config=...)" in message


def test_an_item_over_max_length_follows_data_truncation(tmp_path, tokenizer, pairs):
    path = user_file(tmp_path, VERL_STYLE)
    with pytest.raises(DataError, match=r"item 0 of Pairs .*: 25 tokens, longer than data.max_length=24"):
        user_rows(path, "Pairs", [pairs], tokenizer, max_length=24, truncation="error")
    # the class pads to max_length itself; a class that does not (verl's no_padding) is cut at the right
    no_pad = path.read_text() + textwrap.dedent(
        """
        class Unpadded(Pairs):
            def __getitem__(self, i):
                item = super().__getitem__(i)
                return {k: v[: int(item["attention_mask"].sum())] for k, v in item.items() if k != "attention_mask"}
        """
    )
    unpadded = user_file(tmp_path, no_pad, name="unpadded.py")
    rows = [sft_row("1+2=", "3"), sft_row("1+2=", "345")]
    cut = user_rows(unpadded, "Unpadded", [write_jsonl(tmp_path / "two.jsonl", rows)], tokenizer, 24, "right")
    # row 0 (25 tokens) keeps "3" and loses the EOS; row 1 keeps "3" of "345"
    assert cut[0]["loss_mask"] == cut[1]["loss_mask"] == [0] * 23 + [1]
    assert cut.report == {"total": 2, "kept": 2, "filtered": 0, "truncated": 2}
