"""Supervised fine-tuning on the actor's engine: the token-mean negative log-likelihood of the
response tokens (`loss_mask`, see tandem/data/sft.py), normalised over the global batch."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tandem.algos.aggregation import agg_loss
from tandem.batch import Batch
from tandem.config.schema import TandemConfig
from tandem.engine.base import ModelOutput, TrainEngine, scatter_rows
from tandem.roles.common import MODEL_INPUTS, model_inputs, run_update, scaled_logits, token_stats

# what an SFT batch must hold; a vision-language model's rows add their image inputs (`model_inputs`)
SFT_KEYS = (*MODEL_INPUTS, "loss_mask")


def target_mask(loss_mask: Tensor) -> Tensor:
    """Mask over the positions that PREDICT a loss token: position t scores token t+1 (0 at the end)."""
    return torch.cat([loss_mask[:, 1:], torch.zeros_like(loss_mask[:, :1])], dim=1)


def next_token_log_probs(output: ModelOutput, input_ids: Tensor) -> Tensor:
    """log p(token t+1 | tokens <= t) at every position t, 0 at the last position (nothing follows)
    and where the model computed nothing (padding of packed sequences)."""
    b, width = input_ids.shape
    positions = torch.arange(width - 1, device=input_ids.device).expand(b, width - 1)
    logits, where = output.at(positions)
    stats = token_stats(output, scaled_logits(output, logits, 1.0), input_ids[:, 1:][where])
    log_probs = scatter_rows(stats["log_probs"], where)
    return torch.cat([log_probs, torch.zeros_like(log_probs[:, :1])], dim=1)


class SFT:
    """Supervised steps on a trainable engine (the actor's)."""

    def __init__(self, engine: TrainEngine, cfg: TandemConfig) -> None:
        self.engine = engine
        self.cfg = cfg

    def update(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on this rank's share of a global batch; then one LR-schedule step."""
        missing = [k for k in SFT_KEYS if k not in batch]
        if missing:
            raise KeyError(f"SFT update: the batch lacks {missing}; it has {batch.keys()}")
        batch = model_inputs(batch, "loss_mask")
        batch["target_mask"] = target_mask(batch["loss_mask"])

        def make_loss_fn(counts: dict[str, Any]):
            def loss_fn(output: Any, micro: Batch) -> tuple[Tensor, dict[str, float]]:
                nll = -next_token_log_probs(output, micro["input_ids"])
                loss = agg_loss(nll, micro["target_mask"], "token-mean", **counts)
                return loss, {}

            return loss_fn

        metrics = run_update(
            self.engine,
            batch,
            epochs=1,
            mini_batches_per_epoch=1,
            micro_batch_size=self.cfg.actor.micro_batch_size_per_rank,
            make_loss_fn=lambda counts, _mini: make_loss_fn(counts),
            prefix="sft",
            mask_key="target_mask",
        )
        metrics["sft/tokens"] = float(self.engine.all_reduce_sum(batch["target_mask"].sum().double()))
        return metrics

    def nll(self, batch: Batch) -> Batch:
        """Per row: `nll_sum` (summed over its loss tokens), `num_tokens` and `min_log_prob` (of its
        least likely loss token: above log 1/2, greedy decoding reproduces the row); no gradient."""

        def fn(output: Any, micro: Batch) -> dict[str, Tensor]:
            mask = target_mask(micro["loss_mask"]).float()
            log_probs = next_token_log_probs(output, micro["input_ids"]) * mask  # 0 off the loss tokens
            return {
                "nll_sum": -log_probs.sum(-1),
                "num_tokens": mask.sum(-1),
                "min_log_prob": log_probs.min(-1).values,
            }

        micro = self.cfg.rollout.log_prob_micro_batch_size_per_rank
        return self.engine.forward(model_inputs(batch, "loss_mask"), fn, micro)
