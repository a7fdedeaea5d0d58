"""The SFT trainer on 2 Ray ranks: its loss equals the NLL transformers computes, it learns, it exports."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem.config import load_config
from tandem.data import SFTDataset, StatefulSampler, collate_sft
from tandem.trainer import SFTTrainer

from .trainer_helpers import make_assets

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_sft_loss_is_the_response_nll_and_it_learns(ray_local, tmp_path):
    assets = make_assets(tmp_path / "assets")
    cfg = load_config(
        "sft",
        [
            f"actor.model_path={assets['model']}",
            f"data.train_files=[{assets['train']}]",
            f"data.val_files=[{assets['val']}]",
            "data.max_length=40",
            "data.train_batch_size=8",
            "actor.ppo_mini_batch_size=8",
            "actor.micro_batch_size_per_rank=2",
            "actor.optim.lr=3e-3",
            "actor.optim.lr_scheduler=constant",
            "actor.optim.warmup_ratio=0",
            "trainer.total_training_steps=6",
            "trainer.test_freq=6",
            "trainer.val_before_train=true",
            "trainer.workers_per_node=2",
            "trainer.device=cpu",
            f"trainer.output_dir={tmp_path}",
            "trainer.progress_bar=false",
        ],
        require_data=True,
    )
    trainer = SFTTrainer(cfg)
    history = {m["step"]: m for m in trainer.fit()}

    # Step 1's loss, by hand: token-mean NLL of the response + EOS tokens of the first 8 rows.
    tokenizer = AutoTokenizer.from_pretrained(assets["model"])
    model = AutoModelForCausalLM.from_pretrained(assets["model"])
    rows = SFTDataset([assets["train"]], tokenizer, max_length=40)
    first = StatefulSampler(len(rows), 8, seed=cfg.data.seed).order(0)[:8]
    batch = collate_sft([rows[i] for i in first], tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    nll = torch.nn.functional.cross_entropy(
        logits[:, :-1].transpose(1, 2), batch["input_ids"][:, 1:], reduction="none"
    )
    mask = batch["loss_mask"][:, 1:].float()
    assert history[1]["sft/loss"] == pytest.approx(float((nll * mask).sum() / mask.sum()), rel=1e-5)
    assert history[1]["sft/tokens"] == mask.sum()

    assert history[6]["val/loss"] < history[0]["val/loss"] - 0.5  # it learned the task's format
    exported = AutoModelForCausalLM.from_pretrained(trainer.hf_dir)
    assert not torch.equal(exported.model.embed_tokens.weight, model.model.embed_tokens.weight)
    # The last validation's share of sure rows, by hand from the exported model: every response token's
    # probability above 1/2.
    val_rows = SFTDataset([assets["val"]], tokenizer, max_length=40)
    val = collate_sft([val_rows[i] for i in range(len(val_rows))], tokenizer.pad_token_id)
    with torch.no_grad():
        logits = exported(input_ids=val["input_ids"], attention_mask=val["attention_mask"]).logits
    log_probs = torch.log_softmax(logits[:, :-1], -1).gather(-1, val["input_ids"][:, 1:, None])[..., 0]
    worst = log_probs.masked_fill(val["loss_mask"][:, 1:] == 0, 0.0).min(-1).values
    sure = float((worst > -math.log(2.0)).float().mean())
    assert history[6]["val/sure_match"] == sure  # 0.0 here: 6 steps leave a token under 1/2 in every row
    assert (trainer.hf_dir / "tokenizer.json").is_file()
