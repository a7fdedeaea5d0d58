"""The critic (value model): values of the response tokens and the clipped value update."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from tandem.algos.policy_loss import value_loss
from tandem.batch import Batch
from tandem.config.schema import TandemConfig
from tandem.engine.base import ModelOutput, TrainEngine, scatter_rows
from tandem.roles.common import MODEL_INPUTS, response_outputs, run_update, token_share

UPDATE_KEYS = ("responses", "response_mask", "values", "returns")


def response_values(output: ModelOutput, response_length: int) -> Tensor:
    """V(s_t) [B, R] in float32: the value head's output at the position before each response token
    (0 where the model computed nothing: padding of packed sequences)."""
    values, where = response_outputs(output, response_length)
    return scatter_rows(values[:, 0].float(), where)


class Critic:
    """V(s) on a token-classification model with one label (the value head)."""

    def __init__(self, engine: TrainEngine, cfg: TandemConfig) -> None:
        self.engine = engine
        self.cfg = cfg

    def compute_values(self, batch: Batch) -> Batch:
        """values [B, R], 0 on padding."""

        def fn(output: Any, micro: Batch) -> dict[str, Tensor]:
            mask = micro["response_mask"]
            return {"values": response_values(output, mask.shape[1]) * (mask != 0)}

        micro = self.cfg.critic.micro_batch_size_per_rank
        return self.engine.forward(batch.select(*MODEL_INPUTS, "response_mask"), fn, micro)

    def update(self, batch: Batch, mini_batches: int | None = None) -> dict[str, float]:
        """ppo_epochs passes of the clipped value loss against `returns`, one optimizer step per mini-batch
        (`mini_batches` of them, by default the config's); then one LR-schedule step."""
        c = self.cfg.critic
        missing = [k for k in UPDATE_KEYS if k not in batch]
        if missing:
            raise KeyError(f"critic update: the batch lacks {missing}; it has {batch.keys()}")
        return run_update(
            self.engine,
            batch,
            epochs=c.ppo_epochs,
            mini_batches_per_epoch=mini_batches or self.cfg.derived.critic_mini_batches_per_step,
            micro_batch_size=c.micro_batch_size_per_rank,
            make_loss_fn=lambda counts, _mini: self._loss_fn(counts),
            prefix="critic",
        )

    def _loss_fn(self, counts: dict[str, Any]):
        c = self.cfg.critic
        agg = {**counts, "norm_length": self.cfg.data.max_response_length}

        def loss_fn(output: Any, micro: Batch) -> tuple[Tensor, dict[str, float]]:
            mask = micro["response_mask"]
            values = response_values(output, mask.shape[1])
            loss, metrics = value_loss(
                values, micro["values"], micro["returns"], mask, c.cliprange_value, c.loss_agg_mode, agg
            )
            share = token_share(mask, counts)
            valid = mask != 0
            mean_value = float(values.detach()[valid].sum()) / max(float(counts["global_num_tokens"]), 1.0)
            return loss, {
                "vf_loss": float(loss.detach()),
                "vf_clipfrac": float(metrics["vf_clipfrac"]) * share,
                "vpred_mean": mean_value,
            }

        return loss_fn
