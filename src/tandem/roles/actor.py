"""The actor (policy): log-probs of given responses and the PPO-style update, over any TrainEngine.

Where the old log-probs come from and how the rollout's are corrected for is the run's `RolloutCorrection`
(roles/correction.py); the loss here is the PPO loss over what it hands each micro-batch.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from tandem.algos import POLICY_LOSSES
from tandem.algos.aggregation import agg_loss
from tandem.algos.kl import kl_loss
from tandem.batch import Batch
from tandem.config.schema import TandemConfig
from tandem.engine.base import TrainEngine, scatter_rows
from tandem.engine.router_replay import ROUTED_EXPERTS
from tandem.roles.common import (
    model_inputs,
    response_log_probs,
    response_logits,
    run_update,
    token_share,
    token_stats,
)
from tandem.roles.correction import correction_from_config

# What an update reads from the batch, besides the model inputs and the correction's log-probs.
UPDATE_KEYS = ("responses", "response_mask", "advantages")
# ... and, where the batch has it, the routing the update replays (actor.router_replay)
ROUTING_KEYS = (ROUTED_EXPERTS,)


def update_keys(cfg: TandemConfig) -> tuple[str, ...]:
    """The keys the actor's update reads besides the model inputs and the rollout correction's
    (`RolloutCorrection.update_keys`): the controller selects these, the update refuses a batch without them."""
    return (*UPDATE_KEYS, *(("ref_log_probs",) if cfg.actor.use_kl_loss else ()))


class Actor:
    """The policy. `update` takes this rank's share of a training step's samples."""

    def __init__(self, engine: TrainEngine, cfg: TandemConfig) -> None:
        self.engine = engine
        self.cfg = cfg
        self.temperature = cfg.rollout.temperature
        self.correction = correction_from_config(cfg)

    def compute_log_probs(self, batch: Batch, with_entropy: bool = True) -> Batch:
        """old_log_probs [B, R] (at the rollout temperature) and entropy [B, R] of `responses`; with
        actor.calculate_sum_pi_squared also sum_pi_squared [B, R], sum_v pi_v^2 of each position; with
        actor.router_replay=R2 also `routed_experts` [B, T, L, k], this pass's routing, which the update
        replays when the batch carries it there (verl's R2)."""
        with_spi = self.cfg.actor.calculate_sum_pi_squared

        def fn(output: Any, micro: Batch) -> dict[str, Tensor]:
            responses = micro["responses"]
            logits, where = response_logits(output, responses.shape[1], self.temperature)
            stats = token_stats(
                output, logits, responses[where], entropy=with_entropy, sum_pi_squared=with_spi
            )
            stats["old_log_probs"] = stats.pop("log_probs")
            return {name: scatter_rows(values, where) for name, values in stats.items()}

        micro = self.cfg.rollout.log_prob_micro_batch_size_per_rank
        record = self.cfg.actor.router_replay == "R2" and with_entropy  # the old-log-prob pass, not a probe
        return self.engine.forward(model_inputs(batch, "responses"), fn, micro, record_routing=record)

    def _log_probs(self, batch: Batch) -> Tensor:
        """The policy's log-probs of `batch`'s responses as it stands, no grad [B, R]."""
        return self.compute_log_probs(batch, with_entropy=False)["old_log_probs"]

    def update(self, batch: Batch, mini_batches: int | None = None) -> dict[str, float]:
        """ppo_epochs passes over the batch, one optimizer step per mini-batch (`mini_batches` of them, by
        default the config's; on a worker, this rank's parts of them: `mini_batch_parts`); then one
        LR-schedule step."""
        a = self.cfg.actor
        missing = [k for k in update_keys(self.cfg) if k not in batch] + self.correction.missing_keys(batch)
        if missing:
            raise KeyError(f"actor update: the batch lacks {missing}; it has {batch.keys()}")
        correction = self.correction.for_batch(batch)
        batch = correction.before_update(batch, self.engine)
        metrics = run_update(
            self.engine,
            batch,
            epochs=a.ppo_epochs,
            mini_batches_per_epoch=mini_batches or self.cfg.derived.actor_mini_batches_per_step,
            micro_batch_size=a.micro_batch_size_per_rank,
            make_loss_fn=self._loss_fn,
            prefix="actor",
        )
        return correction.after_update(metrics, self.engine)

    def _loss_fn(self, counts: dict[str, Any], mini: Batch):
        """The PPO loss of one mini-batch's micro-batches: policy loss (+ entropy bonus, + KL to the
        reference), its old log-probs, IS weights and mask as the rollout correction gives them (with what it
        needs of the whole mini-batch first: bypass mode's IS-weight total for batch normalisation)."""
        a = self.cfg.actor
        agg = {**counts, "norm_length": self.cfg.data.max_response_length}
        is_total = self.correction.for_batch(mini).is_weight_total(mini, self.engine, self._log_probs)

        def loss_fn(output: Any, micro: Batch) -> tuple[Tensor, dict[str, float]]:
            mask = micro["response_mask"]
            share = token_share(mask, counts)
            correction = self.correction.for_batch(micro)
            measured_here = correction.entropy_from_update  # no old-log-prob pass gave actor/entropy
            log_probs, entropy = response_log_probs(
                output,
                micro["responses"],
                self.temperature,
                with_entropy=a.entropy_coeff != 0 or measured_here,
            )
            metrics: dict[str, float] = {}
            if measured_here:
                metrics["actor/entropy"] = float(agg_loss(entropy.detach(), mask, "token-mean", **counts))
                if a.entropy_coeff == 0:
                    entropy = None
            inputs = correction.loss_inputs(log_probs.detach(), micro, counts, is_total)
            metrics |= inputs.metrics
            pg = POLICY_LOSSES.entry(inputs.policy_loss)  # its spec names the actor.<setting>s it reads
            pg_loss, pg_metrics = pg.fn(
                inputs.old_log_probs,
                log_probs,
                micro["advantages"],
                inputs.loss_mask,
                is_weights=inputs.is_weights,
                agg_kwargs=agg,
                **{setting: getattr(a, setting) for setting in pg.spec.settings},
            )
            metrics["pg_loss"] = float(pg_loss.detach())
            metrics.update({k: float(v) * share for k, v in pg_metrics.items()})
            loss = pg_loss
            if entropy is not None:
                entropy_loss = agg_loss(entropy, mask, a.loss_agg_mode, **agg)
                loss = loss - a.entropy_coeff * entropy_loss
                metrics["entropy_loss"] = float(entropy_loss.detach())
            if a.use_kl_loss:
                kl = kl_loss(log_probs, micro["ref_log_probs"], mask, a.kl_loss_type, a.loss_agg_mode, agg)
                loss = loss + a.kl_loss_coef * kl
                metrics["kl_loss"] = float(kl.detach())
            return loss, metrics

        return loss_fn
