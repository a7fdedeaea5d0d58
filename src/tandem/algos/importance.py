"""Importance sampling between the rollout engine and the trainer.

The rollout engine (vLLM, SGLang, HF) samples with pi_rollout, whose log-probs differ slightly from
the trainer's pi_old on the same tokens (kernels, precision). Truncated IS weights
w = min(pi_old / pi_rollout, threshold) correct the policy gradient for that mismatch; the
metrics measure it. log-ratio = old - rollout throughout.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tandem.algos.core import masked_mean, upcast, zero_padding
from tandem.algos.registry import IS_LEVELS


def _valid_log_ratio(old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor) -> Tensor:
    # float32 at least: a sequence's sum of bf16 log-ratios would lose the digits that matter.
    # where(), not multiply: padding may hold -inf / NaN log-probs, and inf * 0 is NaN.
    log_ratio = (upcast(old_log_probs) - upcast(rollout_log_probs)).detach()
    return zero_padding(log_ratio, mask)


def _check_threshold(threshold: float) -> float:
    if threshold <= 0:
        raise ValueError(f"the importance-sampling threshold must be > 0, got {threshold}")
    return math.log(threshold)


@IS_LEVELS.register("token")
def token_is_weights(
    old_log_probs: Tensor, rollout_log_probs: Tensor, response_mask: Tensor, threshold: float = 2.0
) -> Tensor:
    """w_t = min(exp(old_t - rollout_t), C), as exp(min(log-ratio, log C)); 0 at padding."""
    log_cap = _check_threshold(threshold)
    log_ratio = _valid_log_ratio(old_log_probs, rollout_log_probs, response_mask)
    return torch.exp(torch.clamp(log_ratio, max=log_cap)) * response_mask.to(log_ratio.dtype)


@IS_LEVELS.register("sequence")
def sequence_is_weights(
    old_log_probs: Tensor, rollout_log_probs: Tensor, response_mask: Tensor, threshold: float = 2.0
) -> Tensor:
    """w_i = min(exp(sum_t m (old - rollout)), C) broadcast over the sequence's valid tokens."""
    log_cap = _check_threshold(threshold)
    log_ratio = _valid_log_ratio(old_log_probs, rollout_log_probs, response_mask)
    seq_log_ratio = log_ratio.sum(dim=-1, keepdim=True)
    return torch.exp(torch.clamp(seq_log_ratio, max=log_cap)) * response_mask.to(log_ratio.dtype)


@torch.no_grad()
def is_weights(
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    response_mask: Tensor,
    level: str = "token",
    threshold: float = 2.0,
) -> Tensor:
    """Truncated IS weights min(pi_old / pi_rollout, threshold) at `level` (token or sequence), detached.

    float32 at least, whatever the log-probs' dtype; 0 at padding.
    """
    fn = IS_LEVELS.get(level)
    return fn(old_log_probs, rollout_log_probs, response_mask, threshold=threshold)


@torch.no_grad()
def mismatch_metrics(
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    response_mask: Tensor,
    threshold: float | None = None,
) -> dict[str, float]:
    """Trainer-vs-rollout mismatch over valid tokens; KL(rollout || old) from rollout samples (k1, k3).

    mismatch_kl = mean(rollout - old); mismatch_k3 = mean(r - 1 - log r), r = exp(old - rollout);
    mismatch_max_ratio / min_ratio = max / min r (1.0 when there is no valid token);
    mismatch_abs_diff_mean = mean |exp(old) - exp(rollout)| (probabilities);
    mismatch_frac_above_threshold = fraction of tokens with r > threshold (only when given).
    """
    mask = response_mask != 0
    log_ratio = _valid_log_ratio(old_log_probs.double(), rollout_log_probs.double(), mask)
    ratio = torch.exp(log_ratio)
    valid_log_ratio = log_ratio[mask]
    any_valid = valid_log_ratio.numel() > 0
    prob_diff = (old_log_probs.double().exp() - rollout_log_probs.double().exp()).abs()
    prob_diff = torch.where(mask, prob_diff, torch.zeros_like(prob_diff))
    metrics = {
        "mismatch_kl": float(masked_mean(-log_ratio, mask)),
        "mismatch_k3": float(masked_mean(ratio - 1.0 - log_ratio, mask)),
        "mismatch_max_ratio": float(torch.exp(valid_log_ratio.max())) if any_valid else 1.0,
        "mismatch_min_ratio": float(torch.exp(valid_log_ratio.min())) if any_valid else 1.0,
        "mismatch_abs_diff_mean": float(masked_mean(prob_diff, mask)),
    }
    if threshold is not None:
        above = (log_ratio > _check_threshold(threshold)).double()
        metrics["mismatch_frac_above_threshold"] = float(masked_mean(above, mask))
    return metrics
