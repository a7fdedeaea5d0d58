"""The actor (policy): log-probs of given responses and the PPO-style update, over any TrainEngine.

When a training step is one optimizer step (cfg.derived.old_log_probs_from_update) the update gets
no `old_log_probs`: they are the update's own log-probs, detached (the weights have not moved since
the rollout), and the numbers the old-log-prob pass fed (`actor/entropy`, `rollout_mismatch/*`,
`rollout_corr/*`) come from the update instead: the last from the whole batch's update log-probs,
gathered over the ranks after the update.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tandem.algos.aggregation import agg_loss
from tandem.algos.importance import mismatch_metrics
from tandem.algos.kl import kl_loss
from tandem.algos.policy_loss import policy_loss
from tandem.algos.rollout_correction import (
    correction_settings,
    is_weight_total,
    rollout_correction,
    rollout_diagnostics,
    rollout_is_weights,
)
from tandem.batch import Batch
from tandem.config.schema import TandemConfig
from tandem.engine.base import TrainEngine, scatter_rows
from tandem.roles.common import (
    model_inputs,
    response_log_probs,
    response_logits,
    run_update,
    token_share,
    token_stats,
)

# What an update reads from the batch, besides the model inputs (and old_log_probs, unless from the update).
UPDATE_KEYS = ("responses", "response_mask", "advantages")
# Bypass mode's rollout-vs-trainer numbers, which add up over micro-batches (token means; max / min do not).
MISMATCH_MEANS = ("mismatch_kl", "mismatch_k3", "mismatch_abs_diff_mean")
RS_KEYS = (
    "rollout_corr/rollout_rs_"  # rejection numbers: the rejected shares and verl's per-option statistics
)


class Actor:
    """The policy. `update` takes this rank's share of a training step's samples."""

    def __init__(self, engine: TrainEngine, cfg: TandemConfig) -> None:
        self.engine = engine
        self.cfg = cfg
        self.temperature = cfg.rollout.temperature
        self.old_log_probs_from_update = cfg.derived.old_log_probs_from_update
        # (update log-probs, rollout log-probs, mask) of each micro-batch, while an update gives the old ones
        self._seen: list[tuple[Tensor, Tensor, Tensor]] | None = None

    def compute_log_probs(self, batch: Batch, with_entropy: bool = True) -> Batch:
        """old_log_probs [B, R] (at the rollout temperature) and entropy [B, R] of `responses`; with
        actor.calculate_sum_pi_squared also sum_pi_squared [B, R], sum_v pi_v^2 of each position."""
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
        return self.engine.forward(model_inputs(batch, "responses"), fn, micro)

    def update(self, batch: Batch, mini_batches: int | None = None) -> dict[str, float]:
        """ppo_epochs passes over the batch, one optimizer step per mini-batch (`mini_batches` of them, by
        default the config's; on a worker, this rank's parts of them: `mini_batch_parts`); then one
        LR-schedule step."""
        a = self.cfg.actor
        missing = [k for k in UPDATE_KEYS if k not in batch]
        if not self.old_log_probs_from_update and "old_log_probs" not in batch:
            missing.append("old_log_probs")
        if a.use_kl_loss and "ref_log_probs" not in batch:
            missing.append("ref_log_probs (actor.use_kl_loss is on)")
        rc = self.cfg.algorithm.rollout_correction
        if (rc.rollout_is or rc.rollout_rs or rc.bypass_mode) and "rollout_log_probs" not in batch:
            missing.append("rollout_log_probs (algorithm.rollout_correction is on)")
        if missing:
            raise KeyError(f"actor update: the batch lacks {missing}; it has {batch.keys()}")
        if (rc.rollout_is or rc.rollout_rs) and "old_log_probs" in batch and not rc.bypass_mode:
            batch = self._correct(batch)
        # Same on every rank (the same keys): the diagnostics' collectives run on all or none.
        from_update = "old_log_probs" not in batch and "rollout_log_probs" in batch
        # bypass mode rejects per micro-batch without statistics (no host sync there): verl's per-option ones
        # come from the rows the update saw, as the update's diagnostics do
        rs_from_update = rc.bypass_mode and rc.rollout_rs is not None and not from_update
        self._seen = [] if from_update or rs_from_update else None
        metrics = run_update(
            self.engine,
            batch,
            epochs=a.ppo_epochs,
            mini_batches_per_epoch=mini_batches or self.cfg.derived.actor_mini_batches_per_step,
            micro_batch_size=a.micro_batch_size_per_rank,
            make_loss_fn=self._loss_fn,
            prefix="actor",
        )
        if from_update:
            metrics.update(self._diagnostics_from_update(batch["responses"].shape[1]))
        elif rs_from_update:  # the micro-batches' own numbers (rejected share, mismatch means) stay
            diagnostics = self._diagnostics_from_update(batch["responses"].shape[1])
            metrics |= {k: v for k, v in diagnostics.items() if k.startswith(RS_KEYS) and k not in metrics}
        return metrics

    def _diagnostics_from_update(self, width: int) -> dict[str, float]:
        """`rollout_diagnostics` of the whole batch from the micro-batches the update saw: each rank's rows
        placed after the lower ranks' in one [3, rows, width] tensor, summed over the ranks (row order
        does not matter to any of these numbers)."""
        seen, self._seen = self._seen or [], None
        local = torch.stack([torch.cat(part) for part in zip(*seen)]) if seen else torch.zeros(3, 0, width)
        rows = torch.zeros(self.engine.dp_size, dtype=torch.float64)
        rows[self.engine.dp_rank] = local.shape[1]
        rows = self.engine.all_reduce_sum(rows)
        total, offset = int(rows.sum()), int(rows[: self.engine.dp_rank].sum())
        full = torch.zeros(3, total, width, dtype=torch.float32)
        full[:, offset : offset + local.shape[1]] = local.float().cpu()
        full = self.engine.all_reduce_sum(full)
        if total == 0:  # e.g. the stages of a pipeline that compute no loss
            return {}
        return rollout_diagnostics(full[0], full[1], full[2], self.cfg.algorithm.rollout_correction)[1]

    def _correct(self, batch: Batch) -> Batch:
        """IS weights and the rejection-masked response_mask of the whole batch, before it is cut into
        mini-batches (verl's decoupled mode); batch normalisation takes its mean over all ranks."""
        rc = self.cfg.algorithm.rollout_correction
        args = (batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"])
        kw = correction_settings(rc)
        norm_total = None
        if rc.rollout_is_batch_normalize:
            weights, loss_mask, _ = rollout_correction(*args, **kw)
            norm_total = self.engine.all_reduce_sum(is_weight_total(weights, loss_mask, rc.rollout_is))
        weights, loss_mask, _ = rollout_correction(
            *args, **kw, rollout_is_batch_normalize=rc.rollout_is_batch_normalize, norm_total=norm_total
        )
        out = batch.select(*batch.keys())
        out["response_mask"] = loss_mask
        if weights is not None:
            out["rollout_is_weights"] = weights
        return out

    def _loss_fn(self, counts: dict[str, Any]):
        a, rc = self.cfg.actor, self.cfg.algorithm.rollout_correction
        agg = {**counts, "norm_length": self.cfg.data.max_response_length}

        def loss_fn(output: Any, micro: Batch) -> tuple[Tensor, dict[str, float]]:
            mask = micro["response_mask"]
            share = token_share(mask, counts)
            on_policy = "old_log_probs" not in micro  # one optimizer step: old = this very forward
            # bypass mode: old = the rollout's log-probs; this forward is compared with the rollout below
            measured_here = on_policy or rc.bypass_mode
            log_probs, entropy = response_log_probs(
                output,
                micro["responses"],
                self.temperature,
                with_entropy=a.entropy_coeff != 0 or measured_here,
            )
            old_log_probs = log_probs.detach() if on_policy else micro["old_log_probs"]
            metrics: dict[str, float] = {}
            if measured_here:
                metrics["actor/entropy"] = float(agg_loss(entropy.detach(), mask, "token-mean", **counts))
                if rc.bypass_mode:  # the policy drifts from the rollout's over mini-batches: their means
                    mismatch = mismatch_metrics(log_probs.detach(), micro["rollout_log_probs"], mask)
                    for key in MISMATCH_MEANS:
                        metrics[f"rollout_mismatch/{key.removeprefix('mismatch_')}"] = mismatch[key] * share
                if a.entropy_coeff == 0:
                    entropy = None
            if (
                self._seen is not None
            ):  # the update gives the old log-probs: the whole batch's numbers after it
                self._seen.append((log_probs.detach(), micro["rollout_log_probs"], mask.to(log_probs.dtype)))
            loss_mask, loss_name = mask, a.policy_loss
            weights = micro.get("rollout_is_weights")  # from _correct, when the old log-probs came first
            if rc.bypass_mode:
                weights, loss_mask, _ = rollout_correction(
                    log_probs.detach(),
                    micro["rollout_log_probs"],
                    mask,
                    **correction_settings(rc),
                    with_metrics=False,
                )
                if rc.rollout_rs is not None:
                    kept = float((loss_mask != 0).sum()) / max(float((mask != 0).sum()), 1.0)
                    metrics["rollout_corr/rollout_rs_masked_fraction"] = (1 - kept) * share
                if weights is not None:
                    metrics["rollout_corr/rollout_is_mean"] = float(
                        agg_loss(weights, mask, "token-mean", **counts)
                    )
                if rc.loss_type == "reinforce":
                    loss_name = "reinforce"
                else:  # ppo_clip: the ratio to the rollout policy is the correction; weights would count it twice
                    weights = None
            elif weights is None and rc.rollout_is is not None:  # old log-probs from this very forward
                weights = rollout_is_weights(
                    old_log_probs,
                    micro["rollout_log_probs"],
                    mask,
                    rc.rollout_is,
                    rc.rollout_is_threshold,
                    correction_settings(rc)["band"],
                )
            pg_loss, pg_metrics = policy_loss(
                loss_name,
                old_log_probs,
                log_probs,
                micro["advantages"],
                loss_mask,
                loss_agg_mode=a.loss_agg_mode,
                clip_ratio_low=a.clip_ratio_low,
                clip_ratio_high=a.clip_ratio_high,
                clip_ratio_c=a.clip_ratio_c,
                tau_pos=a.tau_pos,
                tau_neg=a.tau_neg,
                clip_cov_ratio=a.clip_cov_ratio,
                clip_cov_lb=a.clip_cov_lb,
                clip_cov_ub=a.clip_cov_ub,
                kl_cov_ratio=a.kl_cov_ratio,
                ppo_kl_coef=a.ppo_kl_coef,
                dro_beta=a.dro_beta,
                is_weights=weights,
                agg_kwargs=agg,
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
