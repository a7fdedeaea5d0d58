"""A learned reward model: one score per sample, read at the last token of prompt + response."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tandem.batch import Batch
from tandem.config.schema import TandemConfig
from tandem.engine.base import TrainEngine, scatter_rows
from tandem.roles.common import MODEL_INPUTS


def last_token_index(attention_mask: Tensor) -> Tensor:
    """Index of each row's last attended position (prompts are left-padded, responses right-padded)."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return torch.where(attention_mask != 0, positions, -1).amax(dim=1).clamp(min=0)


class RewardModel:
    """Scores samples with a token-classification model with one label (num_labels=1)."""

    def __init__(self, engine: TrainEngine, cfg: TandemConfig) -> None:
        self.engine = engine
        self.cfg = cfg

    def compute_scores(self, batch: Batch) -> Batch:
        """rm_scores [B]: the head's output at the last attended token of each sample."""

        def fn(output: Any, micro: Batch) -> dict[str, Tensor]:
            scores, where = output.at(last_token_index(micro["attention_mask"])[:, None])
            return {"rm_scores": scatter_rows(scores[:, 0].float(), where)[:, 0]}

        micro = self.cfg.reward.reward_model.micro_batch_size_per_rank
        return self.engine.forward(batch.select(*MODEL_INPUTS), fn, micro)
