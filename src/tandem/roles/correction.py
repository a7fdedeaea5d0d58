"""Rollout correction, chosen once per run: where the PPO loss's old log-probs come from, and how the gap
between the rollout's log-probs and the trainer's is corrected and measured (verl's
`algorithm.rollout_correction`; the tensor math is `algos/rollout_correction.py`).

`correction_from_config(cfg)` picks one of three strategies:

- `Decoupled`: an actor forward pass before the update gives the old log-probs (and `actor/entropy`); the
  step's diagnostics and IS weights come from the whole batch before the advantages; the update applies
  the whole batch's IS weights and rejection mask before cutting it into mini-batches.
- `FromUpdate` (`cfg.derived.old_log_probs_from_update`: a step is one optimizer step, so the weights have
  not moved since the rollout): the update's own log-probs, detached, are the old ones; IS weights per
  micro-batch; the numbers the old-log-prob pass would have fed (`actor/entropy`, `rollout_mismatch/*`,
  `rollout_corr/*`) come from the update, the last from the whole batch gathered over the ranks after it.
- `Bypass` (`bypass_mode`): the rollout's log-probs are the old ones; each micro-batch compares the policy
  being updated with the rollout (IS weights, rejection); `loss_type=reinforce` makes the loss IS-weighted
  REINFORCE, `ppo_clip` keeps actor.policy_loss, whose ratio to the rollout policy is the correction.

The controller (trainer/ppo.py) asks `old_log_prob_pass`, `before_advantages` and `update_keys`; the actor
(roles/actor.py) asks `missing_keys`, `before_update`, `loss_inputs` for each micro-batch and `after_update`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tandem.algos.aggregation import agg_loss
from tandem.algos.importance import mismatch_metrics
from tandem.algos.rollout_correction import (
    batch_normalize,
    correction_settings,
    is_weight_total,
    rollout_correction,
    rollout_diagnostics,
    rollout_is_weights,
)
from tandem.batch import Batch
from tandem.config.schema import TandemConfig
from tandem.engine.base import TrainEngine
from tandem.roles.common import token_share

# Bypass mode's rollout-vs-trainer numbers, which add up over micro-batches (token means; max / min do not).
MISMATCH_MEANS = ("mismatch_kl", "mismatch_k3", "mismatch_abs_diff_mean")
# Rejection numbers: the rejected shares and verl's per-option statistics.
RS_KEYS = "rollout_corr/rollout_rs_"


@dataclass
class LossInputs:
    """What the PPO loss of one micro-batch takes from the correction."""

    old_log_probs: Tensor
    is_weights: Tensor | None  # multiply the policy-gradient terms; None: no weights
    loss_mask: Tensor  # the response mask after rejection
    policy_loss: str  # the registered policy loss's name
    metrics: dict[str, float] = field(default_factory=dict)  # contributions to the mini-batch's value


class RolloutCorrection:
    """The part common to the three strategies; each overrides the hooks where it differs."""

    #: the controller runs the actor's forward pass for the old log-probs before the update
    old_log_prob_pass = False
    #: the update measures actor/entropy itself (no old-log-prob pass did)
    entropy_from_update = False

    def __init__(self, cfg: TandemConfig) -> None:
        self.rc = cfg.algorithm.rollout_correction
        self.policy_loss = cfg.actor.policy_loss
        # while an update gathers its diagnostics: (log-probs, rollout log-probs, mask) of each micro-batch
        self._seen: list[tuple[Tensor, Tensor, Tensor]] | None = None
        self._width = 0

    # ---- the controller's side ---------------------------------------------------------------------

    def before_advantages(self, batch: Batch) -> tuple[Batch, Tensor | None, dict[str, float]]:
        """(the batch with the old log-probs the advantages read, if any; the whole batch's IS weights for
        estimators that read them, or None; the step's rollout-vs-trainer metrics)."""
        return batch, None, {}

    @property
    def update_keys(self) -> tuple[str, ...]:
        """The log-prob keys the actor's update reads, besides the PPO loss's own."""
        return ("old_log_probs", *self._rollout_key())

    # ---- the actor's side --------------------------------------------------------------------------

    def for_batch(self, batch: Batch) -> RolloutCorrection:
        """The strategy for an update (or micro-batch) of `batch`: this one."""
        return self

    def missing_keys(self, batch: Batch) -> list[str]:
        """The keys this correction needs that `batch` lacks, each with why."""
        missing = [] if "old_log_probs" in batch else ["old_log_probs"]
        return missing + self._missing_rollout(batch)

    def before_update(self, batch: Batch, engine: TrainEngine) -> Batch:
        """The batch the update cuts into mini-batches."""
        return batch

    def is_weight_total(
        self, mini: Batch, engine: TrainEngine, log_probs_of: Callable[[Batch], Tensor]
    ) -> Tensor | None:
        """What batch normalisation needs of a whole mini-batch before its first micro-batch's loss (called
        on every rank): None here, where `before_update` normalised the whole batch's weights."""
        return None

    def loss_inputs(
        self, log_probs: Tensor, micro: Batch, counts: dict, is_total: Tensor | None = None
    ) -> LossInputs:
        """The loss's inputs for one micro-batch; `log_probs`: the policy's, detached. IS weights from
        `before_update` when it gave them, else this micro-batch's. `is_total`: `is_weight_total`'s."""
        mask = micro["response_mask"]
        old_log_probs = micro.get("old_log_probs", log_probs)
        if self._seen is not None:
            self._seen.append((log_probs, micro["rollout_log_probs"], mask.to(log_probs.dtype)))
        weights = micro.get("rollout_is_weights")
        if weights is None and self.rc.rollout_is is not None:
            weights = rollout_is_weights(
                old_log_probs,
                micro["rollout_log_probs"],
                mask,
                self.rc.rollout_is,
                self.rc.rollout_is_threshold,
                correction_settings(self.rc)["band"],
            )
        return LossInputs(old_log_probs, weights, mask, self.policy_loss)

    def after_update(self, metrics: dict[str, float], engine: TrainEngine) -> dict[str, float]:
        """The update's metrics with what the correction adds after it."""
        return metrics

    def _rollout_key(self) -> tuple[str, ...]:
        return ("rollout_log_probs",) if self.rc.rollout_is or self.rc.rollout_rs else ()

    def _missing_rollout(self, batch: Batch) -> list[str]:
        needed = self._rollout_key() and "rollout_log_probs" not in batch
        return ["rollout_log_probs (algorithm.rollout_correction is on)"] if needed else []

    def _gathered_diagnostics(self, engine: TrainEngine) -> dict[str, float]:
        """`rollout_diagnostics` of the whole batch from the micro-batches the update saw: each rank's rows
        placed after the lower ranks' in one [3, rows, width] tensor, summed over the ranks (row order
        does not matter to any of these numbers)."""
        seen, self._seen = self._seen or [], None
        local = (
            torch.stack([torch.cat(part) for part in zip(*seen)]) if seen else torch.zeros(3, 0, self._width)
        )
        rows = torch.zeros(engine.dp_size, dtype=torch.float64)
        rows[engine.dp_rank] = local.shape[1]
        rows = engine.all_reduce_sum(rows)
        total, offset = int(rows.sum()), int(rows[: engine.dp_rank].sum())
        full = torch.zeros(3, total, self._width, dtype=torch.float32)
        full[:, offset : offset + local.shape[1]] = local.float().cpu()
        full = engine.all_reduce_sum(full)
        if total == 0:  # e.g. the stages of a pipeline that compute no loss
            return {}
        return rollout_diagnostics(full[0], full[1], full[2], self.rc)[1]


class Decoupled(RolloutCorrection):
    """Old log-probs from the actor's forward pass before the update (verl's decoupled mode)."""

    old_log_prob_pass = True

    def before_advantages(self, batch: Batch) -> tuple[Batch, Tensor | None, dict[str, float]]:
        mask = batch["response_mask"]
        return batch, *rollout_diagnostics(batch["old_log_probs"], batch["rollout_log_probs"], mask, self.rc)

    def before_update(self, batch: Batch, engine: TrainEngine) -> Batch:
        """IS weights and the rejection-masked response_mask of the whole batch, before it is cut into
        mini-batches; batch normalisation takes its mean over all ranks."""
        rc = self.rc
        if not (rc.rollout_is or rc.rollout_rs):
            return batch
        args = (batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"])
        kw = correction_settings(rc)
        norm_total = None
        if rc.rollout_is_batch_normalize:
            weights, loss_mask, _ = rollout_correction(*args, **kw)
            norm_total = engine.all_reduce_sum(is_weight_total(weights, loss_mask, rc.rollout_is))
        weights, loss_mask, _ = rollout_correction(
            *args, **kw, rollout_is_batch_normalize=rc.rollout_is_batch_normalize, norm_total=norm_total
        )
        out = batch.select(*batch.keys())
        out["response_mask"] = loss_mask
        if weights is not None:
            out["rollout_is_weights"] = weights
        return out


class FromUpdate(RolloutCorrection):
    """Old log-probs from the update itself: one optimizer step per training step."""

    entropy_from_update = True

    def __init__(self, cfg: TandemConfig) -> None:
        super().__init__(cfg)
        self._given = Decoupled(cfg)

    @property
    def update_keys(self) -> tuple[str, ...]:
        return ("rollout_log_probs",)  # for rollout_mismatch/*, computed in the update

    def for_batch(self, batch: Batch) -> RolloutCorrection:
        """A batch that brings its own old log-probs (a caller's pass) is corrected as decoupled."""
        return self._given if "old_log_probs" in batch else self

    def missing_keys(self, batch: Batch) -> list[str]:
        return self._missing_rollout(batch)

    def before_update(self, batch: Batch, engine: TrainEngine) -> Batch:
        # Same on every rank (the same keys): the diagnostics' collectives run on all or none.
        self._seen = [] if "rollout_log_probs" in batch else None
        self._width = batch["responses"].shape[1]
        return batch

    def after_update(self, metrics: dict[str, float], engine: TrainEngine) -> dict[str, float]:
        if self._seen is not None:
            metrics.update(self._gathered_diagnostics(engine))
        return metrics


class Bypass(RolloutCorrection):
    """The rollout's log-probs as the old ones: no old-log-prob pass (verl's bypass mode)."""

    entropy_from_update = True

    def before_advantages(self, batch: Batch) -> tuple[Batch, Tensor | None, dict[str, float]]:
        batch["old_log_probs"] = batch["rollout_log_probs"]  # for the KL penalty and the estimators too
        return batch, None, {}

    def _rollout_key(self) -> tuple[str, ...]:
        return ("rollout_log_probs",)

    def before_update(self, batch: Batch, engine: TrainEngine) -> Batch:
        # Rejection per micro-batch keeps no statistics (no host sync there): verl's per-option ones come
        # from the rows the update saw, as the update's diagnostics do.
        self._seen = [] if self.rc.rollout_rs is not None else None
        self._width = batch["responses"].shape[1]
        return batch

    def is_weight_total(
        self, mini: Batch, engine: TrainEngine, log_probs_of: Callable[[Batch], Tensor]
    ) -> Tensor | None:
        """With rollout_is_batch_normalize: [sum, count] of the mini-batch's IS weights over the tokens
        (sequences) rejection keeps, summed over the ranks, from a no-grad forward of the policy being updated.

        verl computes the weights inside each micro-batch's loss and divides them by that micro-batch's mean
        (over the ranks), so its loss changes with how a mini-batch is cut into micro-batches. Tandem divides by
        the mean of the whole mini-batch at the policy of its optimizer step (the weights cannot change
        between its micro-batches: no step is taken until the last), so the loss is the same however it is
        cut, and the same as verl's when a rank's mini-batch is one micro-batch. The cost: one more forward
        pass per mini-batch, with loss_type=reinforce only (ppo_clip applies no IS weights: no pass, and no
        rollout_is_batch_norm_factor)."""
        rc = self.rc
        if rc.rollout_is is None or not rc.rollout_is_batch_normalize or rc.loss_type != "reinforce":
            return None
        weights, loss_mask, _ = rollout_correction(
            log_probs_of(mini),
            mini["rollout_log_probs"],
            mini["response_mask"],
            **correction_settings(rc),
            with_metrics=False,
        )
        return engine.all_reduce_sum(is_weight_total(weights, loss_mask, rc.rollout_is))

    def loss_inputs(
        self, log_probs: Tensor, micro: Batch, counts: dict, is_total: Tensor | None = None
    ) -> LossInputs:
        """This forward compared with the rollout: the policy drifts from it over mini-batches, so the
        mismatch numbers are their means; the weights and the rejection of this micro-batch, the weights
        divided by the mini-batch's mean when `is_total` gives it (`is_weight_total`)."""
        rc, mask, rollout = self.rc, micro["response_mask"], micro["rollout_log_probs"]
        share = token_share(mask, counts)
        mismatch = mismatch_metrics(log_probs, rollout, mask)
        metrics = {
            f"rollout_mismatch/{k.removeprefix('mismatch_')}": mismatch[k] * share for k in MISMATCH_MEANS
        }
        if self._seen is not None:
            self._seen.append((log_probs, rollout, mask.to(log_probs.dtype)))
        weights, loss_mask, _ = rollout_correction(
            log_probs, rollout, mask, **correction_settings(rc), with_metrics=False
        )
        if rc.rollout_rs is not None:
            kept = float((loss_mask != 0).sum()) / max(float((mask != 0).sum()), 1.0)
            metrics["rollout_corr/rollout_rs_masked_fraction"] = (1 - kept) * share
        if weights is not None:  # the mean before batch normalisation, as verl's
            metrics["rollout_corr/rollout_is_mean"] = float(agg_loss(weights, mask, "token-mean", **counts))
        if weights is not None and is_total is not None:
            weights = batch_normalize(weights, loss_mask, rc.rollout_is, is_total)
            factor = float(is_total[0] / is_total[1].clamp(min=1))
            metrics["rollout_corr/rollout_is_batch_norm_factor"] = factor * share
        if rc.loss_type == "reinforce":
            return LossInputs(micro["old_log_probs"], weights, loss_mask, "reinforce", metrics)
        # ppo_clip: the ratio to the rollout policy is the correction; weights would count it twice
        return LossInputs(micro["old_log_probs"], None, loss_mask, self.policy_loss, metrics)

    def after_update(self, metrics: dict[str, float], engine: TrainEngine) -> dict[str, float]:
        """verl's per-option rejection statistics over the whole batch; the micro-batches' own numbers
        (rejected share, mismatch means) stay."""
        if self._seen is not None:
            diagnostics = self._gathered_diagnostics(engine)
            metrics |= {k: v for k, v in diagnostics.items() if k.startswith(RS_KEYS) and k not in metrics}
        return metrics


def correction_from_config(cfg: TandemConfig) -> RolloutCorrection:
    """The run's strategy, from algorithm.rollout_correction.bypass_mode and cfg.derived."""
    if cfg.algorithm.rollout_correction.bypass_mode:
        return Bypass(cfg)
    if cfg.derived.old_log_probs_from_update:
        return FromUpdate(cfg)
    return Decoupled(cfg)
