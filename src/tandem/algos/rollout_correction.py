"""Rollout correction: IS weights with an IcePop band and batch normalisation, rejection sampling,
and the diagnostics of the rollout-vs-trainer gap (verl's `algorithm.rollout_correction`).

Liu, Li et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
Training-Inference Mismatch" (https://richardli.xyz/rl-collapse); IcePop: Ling Team 2025,
"Every Step Evolves" (arXiv 2510.18855). Throughout, log r = old - rollout per valid token
(r = pi_old / pi_rollout), float32 at least, 0 at padding; log-ratios are bounded to +-20 before
exp() (SAFETY_LOG_BOUND) so nothing overflows. Padding never counts, whatever it holds.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from tandem.algo_options import parse_rollout_rs
from tandem.algos.core import masked_mean, masked_sum, upcast, zero_padding
from tandem.algos.importance import is_weights, mismatch_metrics
from tandem.algos.registry import ROLLOUT_RS

SAFETY_LOG_BOUND = 20.0  # exp(20) ~ 4.9e8


def level_log_ratio(old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor, level: str) -> Tensor:
    """log r per token ("token") or sum_t log r_t broadcast over its sequence ("sequence"); 0 at padding."""
    log_ratio = zero_padding((upcast(old_log_probs) - upcast(rollout_log_probs)).detach(), mask)
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand_as(log_ratio)
    elif level != "token":
        raise ValueError(f"rollout_is level must be 'token' or 'sequence', got {level!r}")
    return zero_padding(log_ratio, mask)


@torch.no_grad()
def rollout_is_weights(
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    mask: Tensor,
    level: str = "token",
    threshold: float = 2.0,
    band: tuple[float, float] | None = None,
) -> Tensor:
    """w = min(r, threshold) at `level` (TIS), and w = 0 where r lies outside band = (low, high) (IcePop).

    The band zeroes, it does not clip: a token (or a whole sequence) whose ratio leaves [low, high]
    gets no gradient. Detached; 0 at padding.
    """
    weights = is_weights(old_log_probs, rollout_log_probs, mask, level=level, threshold=threshold)
    if band is None:
        return weights
    low, high = band
    log_ratio = level_log_ratio(old_log_probs, rollout_log_probs, mask, level)
    inside = (log_ratio >= math.log(low) if low > 0 else True) & (log_ratio <= math.log(high))
    return torch.where(inside, weights, torch.zeros_like(weights))


def is_weight_total(weights: Tensor, mask: Tensor, level: str) -> Tensor:
    """[sum of w, count] over valid tokens ("token") or over sequences with a valid token ("sequence").

    float64, so ranks can all-reduce it before `batch_normalize` divides by sum / count.
    """
    valid = mask != 0
    w = zero_padding(weights.double(), valid)
    if level == "token":
        return torch.stack([w.sum(), valid.sum().double()])
    has_token = valid.any(dim=-1)
    per_seq = w.sum(-1) / valid.sum(-1).clamp(min=1)  # a sequence's weight (the same on its tokens)
    return torch.stack([per_seq[has_token].sum(), has_token.sum().double()])


def batch_normalize(weights: Tensor, mask: Tensor, level: str, total: Tensor | None = None) -> Tensor:
    """w / mean(w), the mean over valid tokens or sequences (`is_weight_total`), so the mean becomes 1.

    `total` = the all-reduced [sum, count] when the batch is split over ranks; a mean <= 1e-8 leaves w as it is.
    """
    total = is_weight_total(weights, mask, level) if total is None else total
    mean = float(total[0] / total[1].clamp(min=1))
    return weights / mean if mean > 1e-8 else weights


# ---- rejection sampling ------------------------------------------------------------------------
# Per-token divergence estimators of KL(rollout || old) from rollout samples (Schulman's k1, k2, k3).
_ESTIMATORS = {
    "k1": lambda lr: -lr,  # log(pi_rollout / pi_old)
    "k2": lambda lr: 0.5 * lr**2,
    "k3": lambda lr: torch.exp(lr) - 1.0 - lr,
}


def _seq_sum(stat: Tensor, valid: Tensor) -> Tensor:
    return masked_sum(stat, valid, dim=-1)


def _seq_mean(stat: Tensor, valid: Tensor) -> Tensor:
    return masked_mean(stat, valid, dim=-1)


def _seq_max(stat: Tensor, valid: Tensor) -> Tensor:
    top = torch.where(valid, stat, torch.full_like(stat, -math.inf)).max(dim=-1).values
    return torch.where(valid.any(dim=-1), top, torch.zeros_like(top))


def _register_rs(name: str, estimator: str, reduce) -> None:
    est = _ESTIMATORS[estimator]

    def statistic(log_ratio: Tensor, valid: Tensor) -> Tensor:
        stat = est(log_ratio.clamp(-SAFETY_LOG_BOUND, SAFETY_LOG_BOUND))
        return stat if reduce is None else reduce(stat, valid)

    statistic.__doc__ = f"{name}: {estimator} per token" + (
        "" if reduce is None else f", {reduce.__name__[1:]}"
    )
    ROLLOUT_RS.register(name)(statistic)  # with algo_options' spec: its level and bounds


for _est in ("k1", "k2", "k3"):
    _register_rs(f"token_{_est}", _est, None)
    _register_rs(f"seq_sum_{_est}", _est, _seq_sum)
    _register_rs(f"seq_mean_{_est}", _est, _seq_mean)
for _est in ("k2", "k3"):  # max of k1 is one-sided; verl offers none
    _register_rs(f"seq_max_{_est}", _est, _seq_max)


def _rejections(
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    valid: Tensor,
    rollout_rs: str,
    threshold: float | str | None,
) -> list[tuple[str, float | None, float, Tensor, Tensor]]:
    """(option, lower, upper, statistic, keep-mask) per option of `rollout_rs` (see `rejection_masks`)."""
    log_ratio = zero_padding((upcast(old_log_probs) - upcast(rollout_log_probs)).detach(), valid)
    out = []
    for option, lower, upper in parse_rollout_rs(rollout_rs, threshold):
        stat = ROLLOUT_RS.get(option)(log_ratio, valid)
        if lower is not None:
            ok = (stat >= math.log(lower)) & (stat <= math.log(upper))
        else:
            ok = stat <= upper
        ok = (ok if ok.dim() == 2 else ok.unsqueeze(-1).expand_as(valid)) & valid
        out.append((option, lower, upper, stat, ok))
    return out


@torch.no_grad()
def rejection_masks(
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    mask: Tensor,
    rollout_rs: str,
    threshold: float | str | None,
) -> dict[str, Tensor]:
    """Keep-masks (B, T), bool, False at padding: one per option of `rollout_rs`, and "all" (every option passes).

    An option's statistic s is its estimator per token (token_*), or the sum / mean / max of it over
    the sequence (seq_*, the whole sequence kept or rejected). Kept when lower <= s <= upper for k1
    (bounds in log space: log lower <= log(pi_rollout / pi_old) <= log upper), s <= upper for k2 / k3.
    """
    valid = mask != 0
    return _keep_masks(valid, _rejections(old_log_probs, rollout_log_probs, valid, rollout_rs, threshold))


def _keep_masks(
    valid: Tensor, rejections: list[tuple[str, float | None, float, Tensor, Tensor]]
) -> dict[str, Tensor]:
    keep = {option: ok for option, _, _, _, ok in rejections}
    keep["all"] = torch.stack([valid, *keep.values()]).all(dim=0)
    return keep


# ---- diagnostics -------------------------------------------------------------------------------


def _stats(values: Tensor, prefix: str) -> dict[str, float]:
    """mean, std (population), min, max of a 1-D tensor; all 0 when it is empty."""
    if values.numel() == 0:
        return {f"{prefix}_{k}": 0.0 for k in ("mean", "std", "min", "max")}
    return {
        f"{prefix}_mean": float(values.mean()),
        f"{prefix}_std": float(values.std(unbiased=False)),
        f"{prefix}_min": float(values.min()),
        f"{prefix}_max": float(values.max()),
    }


def effective_sample_size(weights: Tensor) -> float:
    """ESS / N = (sum w)^2 / (N sum w^2) in (0, 1] (Kong 1992); 1 when all w are equal, 1 for no weights."""
    if weights.numel() == 0 or float((weights**2).sum()) == 0:
        return 1.0
    return float(weights.sum() ** 2 / (weights.numel() * (weights**2).sum()))


@torch.no_grad()
def is_metrics(
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    mask: Tensor,
    weights: Tensor,
    level: str,
    threshold: float,
    band: tuple[float, float] | None = None,
) -> dict[str, float]:
    """IS-weight diagnostics; `weights` as applied (truncated, band-zeroed, before batch normalisation).

    Over the units the weights live on (valid tokens for "token", sequences for "sequence"):
    rollout_is_{mean,std} and rollout_is_eff_sample_size of the applied weights; rollout_is_{min,max}
    and rollout_is_ratio_fraction_{high,low} (r > threshold, r < 1 / threshold) of the raw ratio r;
    rollout_is_band_fraction (outside the band, zeroed), with a band. Per sequence, the mean of its
    tokens' applied weights: rollout_is_seq_{mean,std (unbiased),min,max}, _max_deviation (max
    |w - 1|); the mean of its raw ratios: _fraction_high / _low (a mean of truncated weights never
    passes the threshold). These are verl 0.9.1's definitions (bench/verl_parity.py checks them).
    """
    valid = mask != 0
    has_token = valid.any(dim=-1)
    log_ratio = level_log_ratio(old_log_probs.double(), rollout_log_probs.double(), valid, level)
    raw = torch.exp(log_ratio.clamp(-SAFETY_LOG_BOUND, SAFETY_LOG_BOUND))
    if level == "token":
        unit_raw, unit_w = raw[valid], weights.double()[valid]
    else:
        unit_raw, unit_w = raw[has_token, 0], weights.double().max(dim=-1).values[has_token]
    metrics = {k: v for k, v in _stats(unit_w, "rollout_is").items() if k.endswith(("_mean", "_std"))} | {
        k: v for k, v in _stats(unit_raw, "rollout_is").items() if k.endswith(("_min", "_max"))
    }
    n = max(unit_raw.numel(), 1)
    metrics["rollout_is_eff_sample_size"] = effective_sample_size(unit_w)
    metrics["rollout_is_ratio_fraction_high"] = float((unit_raw > threshold).sum()) / n
    metrics["rollout_is_ratio_fraction_low"] = float((unit_raw < 1.0 / threshold).sum()) / n
    if band is not None:
        outside = (unit_raw < band[0]) | (unit_raw > band[1])
        metrics["rollout_is_band_fraction"] = float(outside.sum()) / n
    seq_w = masked_mean(weights.double(), valid, dim=-1)[has_token]
    metrics |= _stats(seq_w, "rollout_is_seq")
    metrics["rollout_is_seq_std"] = float(seq_w.std()) if seq_w.numel() > 1 else 0.0  # unbiased, as verl
    metrics["rollout_is_seq_max_deviation"] = float((seq_w - 1).abs().max()) if seq_w.numel() else 0.0
    seq_raw = masked_mean(raw, valid, dim=-1)[has_token]
    m = max(seq_raw.numel(), 1)
    metrics["rollout_is_seq_fraction_high"] = float((seq_raw > threshold).sum()) / m
    metrics["rollout_is_seq_fraction_low"] = float((seq_raw < 1.0 / threshold).sum()) / m
    return metrics


@torch.no_grad()
def rs_metrics(mask: Tensor, keep: dict[str, Tensor]) -> dict[str, float]:
    """Rejected shares: rollout_rs[_<option>]_masked_fraction of valid tokens, _seq_masked_fraction of
    sequences with a valid token that lost at least one (from `rejection_masks`)."""
    valid = mask != 0
    has_token = valid.any(dim=-1)
    tokens, seqs = max(int(valid.sum()), 1), max(int(has_token.sum()), 1)
    metrics: dict[str, float] = {}
    for option, ok in keep.items():
        name = "rollout_rs" if option == "all" else f"rollout_rs_{option}"
        rejected = valid & ~ok
        metrics[f"{name}_masked_fraction"] = float(rejected.sum()) / tokens
        metrics[f"{name}_seq_masked_fraction"] = float(rejected.any(dim=-1).sum()) / seqs
    return metrics


@torch.no_grad()
def rs_statistics(
    option: str, stat: Tensor, valid: Tensor, lower: float | None, upper: float
) -> dict[str, float]:
    """verl's statistics of one rejection option's statistic s (`_rejections`), as rollout_rs_<option>_*.

    Bounds as the mask uses them: (log lower, log upper) for k1, (0, upper) for k2 / k3. A unit is a
    valid token (token_*) or a sequence with one (seq_*, whose s every token of it carries):
    _mean of s over valid tokens; _max, _min, _fraction_high (s > upper) and _fraction_low (s < lower;
    0 without a lower bound) over units; _std (population) of s clamped to the bounds, over valid tokens.
    Per sequence, v = s (seq_*) or the mean of s over its tokens (token_*): _seq_{mean,std (unbiased),
    max,min}, _seq_max_deviation (max |v|, the distance from the ideal 0), _seq_fraction_high (v > upper)
    and, for k1, _seq_fraction_low. Definitions of verl (rollout_corr_helper.compute_rs_metrics).
    """
    has_token = valid.any(dim=-1)
    stat = stat.double()
    per_token = stat if stat.dim() == 2 else stat.unsqueeze(-1).expand(valid.shape)
    seq = masked_mean(per_token, valid, dim=-1)[has_token] if stat.dim() == 2 else stat[has_token]
    units = per_token[valid] if stat.dim() == 2 else seq
    low, high = (math.log(lower), math.log(upper)) if lower is not None else (0.0, upper)
    p = f"rollout_rs_{option}"
    clamped = per_token[valid].clamp(low, high)
    metrics = {
        f"{p}_mean": float(per_token[valid].mean()) if units.numel() else 0.0,
        f"{p}_max": float(units.max()) if units.numel() else 0.0,
        f"{p}_min": float(units.min()) if units.numel() else 0.0,
        f"{p}_fraction_high": float((units > high).double().mean()) if units.numel() else 0.0,
        f"{p}_fraction_low": float((units < low).double().mean())
        if units.numel() and lower is not None
        else 0.0,
        f"{p}_std": float(clamped.std(unbiased=False)) if clamped.numel() > 1 else 0.0,
    }
    stats = {"mean": 0.0, "std": 0.0, "max": 0.0, "min": 0.0, "max_deviation": 0.0, "fraction_high": 0.0}
    if seq.numel():
        stats = {
            "mean": float(seq.mean()),
            "std": float(seq.std()) if seq.numel() > 1 else 0.0,
            "max": float(seq.max()),
            "min": float(seq.min()),
            "max_deviation": float(seq.abs().max()),
            "fraction_high": float((seq > high).double().mean()),
        }
    if lower is not None:
        stats["fraction_low"] = float((seq < low).double().mean()) if seq.numel() else 0.0
    return metrics | {f"{p}_seq_{k}": v for k, v in stats.items()}


@torch.no_grad()
def offpolicy_metrics(old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor) -> dict[str, float]:
    """Training (pi_old) vs rollout perplexity and chi-square divergence, over sequences with a valid token.

    log_ppl = -mean_t log p per sequence; *_ppl = mean over sequences of exp(log_ppl);
    *_log_ppl = mean of log_ppl; log_ppl_diff = log_ppl_training - log_ppl_rollout per sequence
    (= log(ppl_training / ppl_rollout)), its mean, mean |.|, max, min; ppl_ratio = mean exp(log_ppl_diff);
    chi2_token = mean_t r^2 - 1 over valid tokens; chi2_seq = mean_i (prod_t r_t)^2 - 1 (chi^2(old || rollout)).
    """
    valid = mask != 0
    has_token = valid.any(dim=-1)
    old, rollout = old_log_probs.double(), rollout_log_probs.double()
    train_log_ppl = -masked_mean(zero_padding(old, valid), valid, dim=-1)[has_token]
    roll_log_ppl = -masked_mean(zero_padding(rollout, valid), valid, dim=-1)[has_token]
    diff = train_log_ppl - roll_log_ppl
    log_ratio = zero_padding(old - rollout, valid).clamp(-SAFETY_LOG_BOUND, SAFETY_LOG_BOUND)
    seq_log_ratio = log_ratio.sum(-1)[has_token].clamp(-SAFETY_LOG_BOUND, SAFETY_LOG_BOUND)
    if diff.numel() == 0:
        return {}
    return {
        "training_ppl": float(train_log_ppl.exp().mean()),
        "rollout_ppl": float(roll_log_ppl.exp().mean()),
        "training_log_ppl": float(train_log_ppl.mean()),
        "rollout_log_ppl": float(roll_log_ppl.mean()),
        "log_ppl_diff": float(diff.mean()),
        "log_ppl_abs_diff": float(diff.abs().mean()),
        "log_ppl_diff_max": float(diff.max()),
        "log_ppl_diff_min": float(diff.min()),
        "ppl_ratio": float(diff.exp().mean()),
        "chi2_token": float(masked_mean(torch.exp(2 * log_ratio), valid)) - 1.0,
        "chi2_seq": float(torch.exp(2 * seq_log_ratio).mean()) - 1.0,
    }


@torch.no_grad()
def rollout_correction(
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    mask: Tensor,
    *,
    rollout_is: str | None = None,
    rollout_is_threshold: float = 2.0,
    band: tuple[float, float] | None = None,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float | str | None = None,
    norm_total: Tensor | None = None,
    with_metrics: bool = True,
) -> tuple[Tensor | None, Tensor, dict[str, float]]:
    """(IS weights or None, the loss's response mask after rejection, metrics without a prefix).

    Weights and rejection both start from `mask`; batch normalisation then takes the mean over the
    tokens (or sequences) the rejection kept, so the weights the loss sees average to 1 (verl
    averages over all valid ones). `norm_total`: that [sum, count] all-reduced over ranks.
    with_metrics=False computes no metric (no host synchronisation: bypass mode's every micro-batch).
    """
    metrics = offpolicy_metrics(old_log_probs, rollout_log_probs, mask) if with_metrics else {}
    loss_mask = mask
    if rollout_rs is not None:
        valid = mask != 0
        rejections = _rejections(old_log_probs, rollout_log_probs, valid, rollout_rs, rollout_rs_threshold)
        keep = _keep_masks(valid, rejections)
        if with_metrics:
            metrics |= rs_metrics(mask, keep)
            for option, lower, upper, stat, _ in rejections:
                metrics |= rs_statistics(option, stat, valid, lower, upper)
        loss_mask = keep["all"].to(mask.dtype)
    weights = None
    if rollout_is is not None:
        weights = rollout_is_weights(
            old_log_probs, rollout_log_probs, mask, rollout_is, rollout_is_threshold, band
        )
        if with_metrics:
            metrics |= is_metrics(
                old_log_probs, rollout_log_probs, mask, weights, rollout_is, rollout_is_threshold, band
            )
        if rollout_is_batch_normalize:
            total = is_weight_total(weights, loss_mask, rollout_is) if norm_total is None else norm_total
            weights = batch_normalize(weights, loss_mask, rollout_is, total)
            metrics["rollout_is_batch_norm_factor"] = float(total[0] / total[1].clamp(min=1))
    return weights, loss_mask, metrics


def correction_settings(rc: Any) -> dict[str, Any]:
    """`rollout_correction`'s keywords from an `algorithm.rollout_correction` section (batch
    normalisation apart: the actor normalises over all ranks)."""
    band = None if rc.rollout_is_band_low is None else (rc.rollout_is_band_low, rc.rollout_is_band_high)
    return dict(
        rollout_is=rc.rollout_is,
        rollout_is_threshold=rc.rollout_is_threshold,
        band=band,
        rollout_rs=rc.rollout_rs,
        rollout_rs_threshold=rc.rollout_rs_threshold,
    )


def rollout_diagnostics(
    old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor, rc: Any
) -> tuple[Tensor | None, dict[str, float]]:
    """One step's trainer-vs-rollout numbers over a whole batch: (IS weights or None under
    `algorithm.rollout_correction` `rc`, `rollout_mismatch/*` and `rollout_corr/*` metrics).

    The trainer calls it after the old-log-prob pass; the actor after an update that gave the old
    log-probs itself (roles/actor.py). rollout_corr/kl and k3_kl are verl's names for
    rollout_mismatch/kl and k3; with rollout_rs, rollout_corr/rollout_rs_<option>_* (`rs_statistics`)."""
    metrics = {
        f"rollout_mismatch/{k.removeprefix('mismatch_')}": v
        for k, v in mismatch_metrics(old_log_probs, rollout_log_probs, mask).items()
    }
    weights, _, corr = rollout_correction(
        old_log_probs,
        rollout_log_probs,
        mask,
        **correction_settings(rc),
        rollout_is_batch_normalize=rc.rollout_is_batch_normalize,
    )
    metrics |= {f"rollout_corr/{k}": v for k, v in corr.items()}
    metrics["rollout_corr/kl"] = metrics["rollout_mismatch/kl"]
    metrics["rollout_corr/k3_kl"] = metrics["rollout_mismatch/k3"]
    return weights, metrics
