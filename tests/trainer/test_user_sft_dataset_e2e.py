"""`tandem sft` on the rows of a user's Dataset class (verl's SFT data.custom_cls), in process on 1 rank: two
steps and a validation give the same losses, gradient norms and token counts as the same pairs read by
Tandem's own SFT rows, and step 1's loss is verl's SFT loss computed by hand on the class's padded items."""

from __future__ import annotations

import pytest
import torch
from omegaconf import ListConfig
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem.data import StatefulSampler
from tandem.data.user_dataset import load_dataset_class
from tandem.data.user_sft_dataset import sft_dataset_config
from tandem.trainer import SFTTrainer

from .trainer_helpers import by_step, make_assets, run_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# verl's SFTDataset item shape for the addition pairs: the chat-rendered prompt, the response + EOS, right-padded
# to config.max_length; loss_mask 1 on the response and the EOS (token j trained, as verl's trainers read it)
USER_CLASS = """\
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset


class AdditionPairs(Dataset):
    def __init__(self, parquet_files, tokenizer, config, processor=None, max_samples=-1):
        self.rows = [row for path in parquet_files for row in pq.read_table(path).to_pylist()]
        self.tokenizer, self.max_length = tokenizer, config.max_length

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        row, tok = self.rows[i], self.tokenizer
        text = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        response = tok(row["response"] + tok.eos_token, add_special_tokens=False)["input_ids"]
        pad = self.max_length - len(prompt) - len(response)
        loss_mask = torch.tensor([0] * len(prompt) + [1] * len(response) + [0] * pad)
        attention_mask = torch.tensor([1] * (len(prompt) + len(response)) + [0] * pad)
        return {
            "input_ids": torch.tensor(prompt + response + [tok.pad_token_id] * pad),
            "attention_mask": attention_mask,
            "position_ids": torch.clamp(torch.cumsum(attention_mask, 0) - 1, min=0),
            "loss_mask": loss_mask,
        }
"""
COMPARED = ("sft/loss", "sft/grad_norm", "sft/tokens", "sft/lr", "val/loss", "val/sure_match")


def sft_run(assets, out, *extra):
    return run_config(
        assets,
        out,
        "sft",
        "trainer.backend=inprocess",
        "trainer.workers_per_node=1",
        "data.max_length=40",
        "data.train_batch_size=4",
        "actor.ppo_mini_batch_size=4",
        "actor.micro_batch_size_per_rank=2",
        "actor.optim.lr=3e-3",
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        "trainer.val_before_train=false",
        *extra,
    )


def test_a_user_class_trains_as_tandems_own_rows_of_the_same_pairs(tmp_path):
    assets = make_assets(tmp_path / "assets")
    user_file = tmp_path / "pairs.py"
    user_file.write_text(USER_CLASS)
    keys = (f"data.custom_dataset_file={user_file}", "data.custom_dataset_class=AdditionPairs")
    mine = SFTTrainer(sft_run(assets, tmp_path / "mine", *keys))
    built_in = SFTTrainer(sft_run(assets, tmp_path / "built_in"))
    assert len(mine.train_data) == len(built_in.train_data) == 16 and len(mine.val_data) == 8
    assert [mine.train_data[i] for i in range(16)] == [built_in.train_data[i] for i in range(16)]
    assert [mine.val_data[i] for i in range(8)] == [built_in.val_data[i] for i in range(8)]

    ours, theirs = by_step(mine.fit()), by_step(built_in.fit())
    for step, key in [(1, k) for k in COMPARED[:4]] + [(2, k) for k in COMPARED]:
        assert ours[step][key] == pytest.approx(theirs[step][key], rel=1e-6), f"step {step} {key}"

    # step 1 by verl's SFT loss on the class's padded items: labels input_ids[:, 1:] weighted by loss_mask[:, 1:]
    tokenizer = AutoTokenizer.from_pretrained(assets["model"])
    cfg = mine.cfg
    items = load_dataset_class(str(user_file), "AdditionPairs")(
        ListConfig([str(assets["train"])]), tokenizer, sft_dataset_config(cfg.data, 40)
    )
    first = StatefulSampler(16, 4, seed=cfg.data.seed).order(0)[:4]
    batch = {k: torch.stack([items[i][k] for i in first]) for k in items[0]}
    model = AutoModelForCausalLM.from_pretrained(assets["model"])
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits
    nll = torch.nn.functional.cross_entropy(
        logits[:, :-1].transpose(1, 2), batch["input_ids"][:, 1:], reduction="none"
    )
    mask = batch["loss_mask"][:, 1:].float()
    assert ours[1]["sft/loss"] == pytest.approx(float((nll * mask).sum() / mask.sum()), rel=1e-5)
    assert ours[1]["sft/tokens"] == mask.sum()
