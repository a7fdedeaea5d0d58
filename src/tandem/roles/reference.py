"""The reference policy: the frozen initial model's log-probs, for KL terms."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from tandem.batch import Batch
from tandem.config.schema import TandemConfig
from tandem.engine.base import TrainEngine
from tandem.roles.common import model_inputs, response_log_probs


class Reference:
    """log pi_ref(response) at the rollout temperature, on an engine without an optimizer."""

    def __init__(self, engine: TrainEngine, cfg: TandemConfig) -> None:
        self.engine = engine
        self.cfg = cfg

    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        """ref_log_probs [B, R]."""
        temperature = self.cfg.rollout.temperature

        def fn(output: Any, micro: Batch) -> dict[str, Tensor]:
            log_probs, _ = response_log_probs(output, micro["responses"], temperature, False)
            return {"ref_log_probs": log_probs}

        micro = self.cfg.reference.log_prob_micro_batch_size_per_rank
        return self.engine.forward(model_inputs(batch, "responses"), fn, micro)
