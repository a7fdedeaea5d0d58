"""Policy losses (PPO clip with dual clip, GSPO, REINFORCE, CISPO, GMPO, SAPO) and the clipped value loss.

Every policy loss takes (old_log_probs, log_probs, advantages, response_mask) as (B, T) tensors and
the same keywords, and returns (scalar loss, metrics). The scalar is aggregated by `agg_loss`
(`loss_agg_mode`, with `agg_kwargs` = the global counts; see aggregation.py for the contract).
Metrics are detached 0-d tensors: pg_clipfrac, pg_clipfrac_lower, ppo_kl for every loss, so that
the trainer logs the same keys whichever loss runs.

Log-ratios are taken in float32 at least (exp() overflows float16 at 11, and inf * 0 is a NaN
gradient) and are 0 at padding, so that -inf / NaN log-probs of pad tokens reach neither the loss
nor the gradient. old_log_probs is a constant (detached), even when the caller passes a tensor
that carries a graph (on-policy: old = logp).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tandem.algos.aggregation import agg_loss
from tandem.algos.core import masked_mean, upcast, zero_padding
from tandem.algos.registry import POLICY_LOSSES

# exp() of a log-ratio beyond this overflows float32 / explodes the loss; the clamp kills its gradient.
MAX_LOG_RATIO = 20.0
GSPO_MAX_LOG_RATIO = 10.0  # verl's cap on GSPO's sequence log-ratio (from above only)


def _log_ratio(log_probs: Tensor, old_log_probs: Tensor, mask: Tensor) -> Tensor:
    """logp - old in float32 at least, 0 at padding (no gradient there either)."""
    return zero_padding(upcast(log_probs) - upcast(old_log_probs).detach(), mask)


def _weighted(per_token: Tensor, is_weights: Tensor | None) -> Tensor:
    return per_token if is_weights is None else per_token * is_weights.detach()


def _metrics(log_ratio: Tensor, mask: Tensor, clipped: Tensor, clipped_lower: Tensor) -> dict[str, Tensor]:
    """pg_clipfrac, pg_clipfrac_lower: fractions of valid tokens; ppo_kl = mean(old - logp), k1."""
    return {
        "pg_clipfrac": masked_mean(clipped.to(log_ratio.dtype), mask).detach(),
        "pg_clipfrac_lower": masked_mean(clipped_lower.to(log_ratio.dtype), mask).detach(),
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
    }


def _clipped_surrogate(
    ratio: Tensor, advantages: Tensor, clip_ratio_low: float, clip_ratio_high: float
) -> tuple[Tensor, Tensor]:
    """max(-A r, -A clip(r, 1 - low, 1 + high)) and where the clipped branch is the larger."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


@POLICY_LOSSES.register("vanilla")
def vanilla(
    old_log_probs: Tensor,
    log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    is_weights: Tensor | None = None,
    agg_kwargs: dict[str, Any] | None = None,
    **_: Any,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clip: max(-A r, -A clip(r, 1-lo, 1+hi)), r = exp(logp - old); for A < 0 min(., -A c) (dual clip)."""
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c (the dual-clip bound) must be > 1, got {clip_ratio_c}")
    log_ratio = _log_ratio(log_probs, old_log_probs, response_mask)
    ratio = torch.exp(torch.clamp(log_ratio, -MAX_LOG_RATIO, MAX_LOG_RATIO))
    pg, clipped = _clipped_surrogate(ratio, advantages, clip_ratio_low, clip_ratio_high)
    dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    clipped_lower = negative & (pg > dual_bound)
    pg = torch.where(negative, torch.minimum(pg, dual_bound), pg)
    loss = agg_loss(_weighted(pg, is_weights), response_mask, loss_agg_mode, **(agg_kwargs or {}))
    return loss, _metrics(log_ratio, response_mask, clipped, clipped_lower)


@POLICY_LOSSES.register("gspo")
def gspo(
    old_log_probs: Tensor,
    log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    is_weights: Tensor | None = None,
    agg_kwargs: dict[str, Any] | None = None,
    **_: Any,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO-token: s_i,t = sg(s_i) exp(logp_t - sg(logp_t)), s_i = exp(mean_t(logp - old)); PPO-clipped.

    The GSPO paper clips with tiny ranges (about 3e-4 / 4e-4); pass them as clip_ratio_low/high,
    nothing here overrides the defaults. No dual clip. With loss_agg_mode="seq-mean-token-mean"
    the gradient is the paper's sequence-level one: s_i A_i mean_t grad logp_t.
    """
    log_ratio = _log_ratio(log_probs, old_log_probs, response_mask)
    seq_log_ratio = masked_mean(log_ratio, response_mask, dim=-1)
    # value: the sequence's log-ratio on every token; gradient: that token's d logp_t.
    token_seq_log_ratio = seq_log_ratio.detach()[:, None] + log_ratio - log_ratio.detach()
    # Capped from above at 10 as verl caps it: a runaway ratio gives a bounded loss and, being clamped,
    # no gradient (a symmetric +-20 let the loss of a negative advantage grow by e^10 more).
    ratio = torch.exp(torch.clamp(token_seq_log_ratio, max=GSPO_MAX_LOG_RATIO))
    pg, clipped = _clipped_surrogate(ratio, advantages, clip_ratio_low, clip_ratio_high)
    loss = agg_loss(_weighted(pg, is_weights), response_mask, loss_agg_mode, **(agg_kwargs or {}))
    return loss, _metrics(log_ratio, response_mask, clipped, torch.zeros_like(clipped))


@POLICY_LOSSES.register("reinforce")
def reinforce(
    old_log_probs: Tensor,
    log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    is_weights: Tensor | None = None,
    agg_kwargs: dict[str, Any] | None = None,
    **_: Any,
) -> tuple[Tensor, dict[str, Tensor]]:
    """REINFORCE: l_t = -A_t logp_t (times the IS weight when given); no ratio, no clip."""
    pg = -advantages * zero_padding(upcast(log_probs), response_mask)
    loss = agg_loss(_weighted(pg, is_weights), response_mask, loss_agg_mode, **(agg_kwargs or {}))
    no_clip = torch.zeros_like(response_mask, dtype=torch.bool)
    return loss, _metrics(
        _log_ratio(log_probs, old_log_probs, response_mask), response_mask, no_clip, no_clip
    )


@POLICY_LOSSES.register("cispo")
def cispo(
    old_log_probs: Tensor,
    log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    is_weights: Tensor | None = None,
    agg_kwargs: dict[str, Any] | None = None,
    **_: Any,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): l_t = -sg(clip(r_t, 1 - low, 1 + high)) A_t logp_t.

    The importance weight is clipped and detached, so every token keeps its gradient -w_t A_t (PPO's
    clip drops the clipped tokens' gradient). pg_clipfrac = share of tokens whose weight was clipped.
    """
    log_ratio = _log_ratio(log_probs, old_log_probs, response_mask)
    ratio = torch.exp(torch.clamp(log_ratio, -MAX_LOG_RATIO, MAX_LOG_RATIO))
    weight = torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high).detach()
    pg = -weight * advantages * zero_padding(upcast(log_probs), response_mask)
    loss = agg_loss(_weighted(pg, is_weights), response_mask, loss_agg_mode, **(agg_kwargs or {}))
    clipped = weight != ratio.detach()
    return loss, _metrics(log_ratio, response_mask, clipped, torch.zeros_like(clipped))


@POLICY_LOSSES.register("geo_mean")
def geo_mean(
    old_log_probs: Tensor,
    log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    is_weights: Tensor | None = None,
    agg_kwargs: dict[str, Any] | None = None,
    **_: Any,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GMPO (arXiv 2507.20673): l_i = -A_i exp(mean_t c_t), the geometric mean of the token ratios.

    c_t = sign(A) min(sign(A) d_t, sign(A) clip(d_t, -low, high)) with d_t = logp_t - old_t: the log-ratio
    clipped per token, pessimistically for the advantage's sign (the clip range applies to log-ratios,
    as in the paper and verl). A_i is the token-mean advantage of sequence i; the loss is the mean over
    sequences whatever loss_agg_mode says (GMPO is a sequence-level objective). IS weights enter as
    their per-sequence geometric mean. pg_clipfrac / _lower: clipped tokens with A > 0 / A < 0.
    """
    log_ratio = _log_ratio(log_probs, old_log_probs, response_mask)
    sign = torch.sign(advantages)
    clamped = torch.clamp(log_ratio, -clip_ratio_low, clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    seq_ratio = torch.exp(masked_mean(pessimistic, response_mask, dim=-1))
    seq_advantage = masked_mean(upcast(advantages), response_mask, dim=-1)
    per_seq = -seq_advantage * seq_ratio
    if is_weights is not None:
        log_w = torch.log(is_weights.detach().to(per_seq.dtype).clamp(min=1e-10))
        per_seq = per_seq * torch.exp(masked_mean(log_w, response_mask, dim=-1))
    # every token of a sequence carries its loss: seq-mean-token-mean gives back the mean over sequences
    loss = agg_loss(
        per_seq[:, None].expand_as(log_ratio), response_mask, "seq-mean-token-mean", **(agg_kwargs or {})
    )
    clipped = log_ratio != clamped
    return loss, _metrics(log_ratio, response_mask, clipped & (advantages > 0), clipped & (advantages < 0))


@POLICY_LOSSES.register("sapo")
def sapo(
    old_log_probs: Tensor,
    log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    is_weights: Tensor | None = None,
    agg_kwargs: dict[str, Any] | None = None,
    **_: Any,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO (arXiv 2511.20347): l_t = -f(r_t) A_t with the soft gate f(r) = (4 / tau) sigmoid(tau (r - 1)).

    tau is tau_pos where A_t > 0, else tau_neg. f(1) = 2 / tau and f'(1) = 1, so on-policy the gradient
    is the policy gradient; far from r = 1 the gate flattens (a soft clip, no hard cut). Aggregated as
    seq-mean-token-mean whatever loss_agg_mode says, as the paper and verl do. Nothing is clipped:
    pg_clipfrac and pg_clipfrac_lower are 0.
    """
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"sapo: tau_pos and tau_neg must be > 0, got {tau_pos} and {tau_neg}")
    log_ratio = _log_ratio(log_probs, old_log_probs, response_mask)
    ratio = torch.exp(torch.clamp(log_ratio, -MAX_LOG_RATIO, MAX_LOG_RATIO))
    tau = torch.full_like(ratio, tau_neg).masked_fill(advantages > 0, tau_pos)  # in ratio's precision
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg = -gate * advantages
    loss = agg_loss(_weighted(pg, is_weights), response_mask, "seq-mean-token-mean", **(agg_kwargs or {}))
    none = torch.zeros_like(response_mask, dtype=torch.bool)
    return loss, _metrics(log_ratio, response_mask, none, none)


def policy_loss(name: str, *args: Any, **kwargs: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """Look `name` up in POLICY_LOSSES and call it: (loss, metrics) = fn(old, logp, A, mask, **kw)."""
    return POLICY_LOSSES.get(name)(*args, **kwargs)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    agg_kwargs: dict[str, Any] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss: 0.5 max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2).

    V is clamped into [V_old - c, V_old + c] itself (as verl does), not written as V_old + clip(V - V_old):
    in floating point that sum need not give back V when nothing is clipped, and vf_clipfrac then counted
    unclipped tokens as clipped."""
    values, old_values, returns = upcast(values), upcast(old_values), upcast(returns)
    clipped_values = torch.clamp(values, old_values - cliprange_value, old_values + cliprange_value)
    unclipped_sq = (values - returns) ** 2
    clipped_sq = (clipped_values - returns) ** 2
    loss_mat = 0.5 * torch.maximum(unclipped_sq, clipped_sq)
    loss = agg_loss(loss_mat, response_mask, loss_agg_mode, **(agg_kwargs or {}))
    clipfrac = masked_mean((clipped_sq > unclipped_sq).to(values.dtype), response_mask)
    return loss, {"vf_clipfrac": clipfrac.detach()}
