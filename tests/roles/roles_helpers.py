"""Shared pieces of the role tests: a tiny model folder, a config for it, prompt and update batches."""

from __future__ import annotations

from pathlib import Path

import torch

from tandem.batch import Batch
from tandem.config import load_config
from tandem.config.schema import TandemConfig
from tandem.data.padding import pad_sequences, position_ids_from_mask
from tandem.models.tiny import build_tokenizer

PROMPTS = ["1+2=", "13+45=", "7+8=", "99+1=", "0+0=", "42+17="]


def tiny_config(model_path: Path, workers: int, *overrides: str) -> TandemConfig:
    """GRPO over `workers` CPU ranks: 4 prompts x 2 samples per step, 2 mini-batches, fp32."""
    return load_config(
        "grpo",
        [
            f"actor.model_path={model_path}",
            f"trainer.workers_per_node={workers}",
            "trainer.device=cpu",
            "data.train_batch_size=4",
            "data.max_response_length=12",
            "rollout.n=2",
            "actor.ppo_mini_batch_size=2",
            "actor.micro_batch_size_per_rank=1",
            "actor.optim.lr=1e-3",
            "critic.optim.lr=1e-3",
            "rollout.log_prob_micro_batch_size_per_rank=3",
            *overrides,
        ],
    )


def prompt_batch(texts: list[str]) -> Batch:
    """Left-padded prompts of different lengths, as collate_prompts builds them."""
    tokenizer = build_tokenizer()
    ids = [tokenizer(t)["input_ids"] for t in texts]
    input_ids = pad_sequences(ids, tokenizer.pad_token_id, side="left")
    attention_mask = pad_sequences([[1] * len(i) for i in ids], 0, side="left")
    return Batch.from_dict(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids_from_mask(attention_mask),
            "prompt_index": torch.arange(len(texts)),  # seeded samples then do not depend on the ranks
        },
        {"raw_prompt": texts},
    )


def update_batch(rollout: Batch, seed: int = 0) -> Batch:
    """Rollout output plus the keys an update reads: fixed advantages, values and returns."""
    g = torch.Generator().manual_seed(seed)
    mask = rollout["response_mask"].float()
    n, length = mask.shape
    advantages = torch.randn(n, 1, generator=g).expand(n, length) * mask
    values = torch.randn(n, length, generator=g) * 0.1 * mask
    returns = torch.randn(n, 1, generator=g).expand(n, length) * mask
    extra = Batch.from_dict(
        {"advantages": advantages.contiguous(), "values": values, "returns": returns.contiguous()}
    )
    return rollout.union(extra)


def rollout_rows(lengths: list[tuple[int, int]], prompt: int, response: int, seed: int = 0) -> Batch:
    """Rollout-shaped rows (rollout/base.py layout): (prompt, response) tokens per row as `lengths`, left-padded
    prompts of width `prompt`, right-padded responses of width `response`, random tokens and every key the
    roles' updates read."""
    g = torch.Generator().manual_seed(seed)
    n = len(lengths)
    prompt_mask = torch.zeros(n, prompt, dtype=torch.long)
    response_mask = torch.zeros(n, response, dtype=torch.long)
    for i, (p, r) in enumerate(lengths):
        prompt_mask[i, prompt - p :] = 1
        response_mask[i, :r] = 1
    prompts = torch.randint(4, 200, (n, prompt), generator=g) * prompt_mask
    responses = torch.randint(4, 200, (n, response), generator=g) * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    mask = response_mask.float()
    return Batch.from_dict(
        {
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids_from_mask(attention_mask),
            "loss_mask": attention_mask * torch.cat([torch.zeros_like(prompt_mask), response_mask], 1),
            "advantages": (torch.randn(n, 1, generator=g) * mask).contiguous(),
            "returns": (torch.randn(n, 1, generator=g) * mask).contiguous(),
            "values": torch.randn(n, response, generator=g) * 0.1 * mask,
            "rollout_log_probs": -torch.rand(n, response, generator=g) * 3 * mask,
            "old_log_probs": -torch.rand(n, response, generator=g) * 3 * mask,
            "ref_log_probs": -torch.rand(n, response, generator=g) * 3 * mask,
        }
    )
