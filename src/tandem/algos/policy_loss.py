"""Policy losses (PPO clip with dual clip, GSPO, REINFORCE and GPG, CISPO, GMPO, SAPO, Clip-Cov, KL-Cov, DRO, DPPO)
and the clipped value loss.

Every policy loss takes (old_log_probs, log_probs, advantages, response_mask) as (B, T) tensors,
`is_weights` and `agg_kwargs`, and the settings its spec in tandem/algo_options.py names (`actor.<name>`:
the actor passes exactly those), and returns (scalar loss, metrics). The scalar is aggregated by `agg_loss`
(`loss_agg_mode`, with `agg_kwargs` = the global counts; see aggregation.py for the contract).
Metrics are detached 0-d tensors: pg_clipfrac, pg_clipfrac_lower, ppo_kl for every loss, so that
the trainer logs the same keys whichever loss runs.

Log-ratios are taken in float32 at least (exp() overflows float16 at 11, and inf * 0 is a NaN
gradient) and are 0 at padding, so that -inf / NaN log-probs of pad tokens reach neither the loss
nor the gradient. old_log_probs is a constant (detached), even when the caller passes a tensor
that carries a graph (on-policy: old = logp).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from tandem.algos.aggregation import agg_loss
from tandem.algos.core import masked_mean, upcast, zero_padding
from tandem.algos.registry import POLICY_LOSSES

# exp() of a log-ratio beyond this overflows float32 / explodes the loss; the clamp kills its gradient.
MAX_LOG_RATIO = 20.0
GSPO_MAX_LOG_RATIO = 10.0  # verl's cap on GSPO's sequence log-ratio (from above only)
BINARY_KL_EPS = 1e-8  # verl's guard in DPPO's log((1 - p_old) / (1 - p)) for p = 1


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
) -> tuple[Tensor, dict[str, Tensor]]:
    """REINFORCE: l_t = -A_t logp_t (times the IS weight when given); no ratio, no clip."""
    pg = -advantages * zero_padding(upcast(log_probs), response_mask)
    loss = agg_loss(_weighted(pg, is_weights), response_mask, loss_agg_mode, **(agg_kwargs or {}))
    no_clip = torch.zeros_like(response_mask, dtype=torch.bool)
    return loss, _metrics(
        _log_ratio(log_probs, old_log_probs, response_mask), response_mask, no_clip, no_clip
    )


# GPG (Chu et al. 2025, verl's `gpg` loss mode): l_t = -A_t logp_t, no ratio and no clip: REINFORCE's loss under
# verl's name, paired with the gpg advantage estimator
POLICY_LOSSES.register("gpg")(reinforce)


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
    loss_agg_mode: str | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GMPO (arXiv 2507.20673): l_i = -A_i exp(mean_t c_t), the geometric mean of the token ratios.

        c_t = sign(A) min(sign(A) d_t, sign(A) clip(d_t, -low, high)) with d_t = logp_t - old_t: the log-ratio
        clipped per token, pessimistically for the advantage's sign (the clip range applies to log-ratios,
        as in the paper and verl). A_i is the token-mean advantage of sequence i; the loss is the mean over
        sequences whatever loss_agg_mode says (GMPO is a sequence-level objective: its spec does not name
    actor.loss_agg_mode, and a loss_agg_mode given here is not read). IS weights enter as
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


def _token_covariance(advantages: Tensor, log_probs: Tensor, mask: Tensor) -> Tensor:
    """(A_t - mean A)(logp_t - mean logp), means over the valid tokens: each token's term of Cov(logp, A)."""
    adv = zero_padding(upcast(advantages).detach(), mask)
    logp = zero_padding(upcast(log_probs).detach(), mask)
    return (adv - masked_mean(adv, mask)) * (logp - masked_mean(logp, mask))


def _token_budget(mask: Tensor, fraction: float) -> Tensor:
    """max(1, floor(fraction x valid tokens)) as a 0-d tensor: a count that stays on the device."""
    valid = (mask != 0).sum().to(torch.float64)  # float64: the same floor as verl's Python int()
    return torch.clamp(torch.floor(valid * fraction), min=1.0)


def _largest(key: Tensor, count: Tensor) -> Tensor:
    """True at the `count` largest entries of `key` (ties: the earlier position first); fixed shapes."""
    flat = key.reshape(-1)
    order = torch.argsort(flat, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(flat.numel(), device=flat.device))
    return rank.view_as(key) < count


@POLICY_LOSSES.register("clip_cov")
def clip_cov(
    old_log_probs: Tensor,
    log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    is_weights: Tensor | None = None,
    agg_kwargs: dict[str, Any] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clip-Cov (Cui et al. 2025, arXiv 2505.22617): PPO clip; random tokens with lb < cov_t < ub get loss 0.

    cov_t = (A_t - mean A)(logp_t - mean logp) over the N valid tokens of the micro-batch (verl's scope).
    Among the valid tokens that PPO did not clip and whose cov_t lies strictly in (clip_cov_lb,
    clip_cov_ub), max(1, floor(clip_cov_ratio N)) picked uniformly at random (torch's generator of the
    tensors' device: seeded runs repeat, CPU and CUDA pick differently) get loss 0 and so no gradient,
    as in verl (the paper detaches them; same gradient). No dual clip, as in verl.
    pg_clipfrac = share of tokens dropped this way (verl's metric; PPO-clipped tokens not counted).
    """
    if clip_cov_ratio <= 0:
        raise ValueError(f"clip_cov: clip_cov_ratio must be > 0, got {clip_cov_ratio}")
    log_ratio = _log_ratio(log_probs, old_log_probs, response_mask)
    ratio = torch.exp(torch.clamp(log_ratio, -MAX_LOG_RATIO, MAX_LOG_RATIO))
    pg, clipped = _clipped_surrogate(ratio, advantages, clip_ratio_low, clip_ratio_high)
    cov = _token_covariance(advantages, log_probs, response_mask)
    candidate = (response_mask != 0) & ~clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    # a random order of the candidates (uniform keys), every other token after them (key -1)
    key = torch.where(candidate, torch.rand_like(cov), torch.full_like(cov, -1.0))
    dropped = candidate & _largest(key, _token_budget(response_mask, clip_cov_ratio))
    pg = torch.where(dropped, torch.zeros_like(pg), pg)
    loss = agg_loss(_weighted(pg, is_weights), response_mask, loss_agg_mode, **(agg_kwargs or {}))
    return loss, _metrics(log_ratio, response_mask, dropped, torch.zeros_like(dropped))


@POLICY_LOSSES.register("kl_cov")
def kl_cov(
    old_log_probs: Tensor,
    log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 0.1,
    is_weights: Tensor | None = None,
    agg_kwargs: dict[str, Any] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617): l_t = -A_t r_t + coef |logp_t - old_t| on the top-k cov_t.

    cov_t = (A_t - mean A)(logp_t - mean logp) over the N valid tokens of the micro-batch (verl's scope);
    the k = max(1, floor(kl_cov_ratio N)) largest get the penalty, coef = ppo_kl_coef (ties: the earlier
    position). No clip.
    pg_clipfrac = share of penalised tokens (verl logs none); ppo_kl is the k1 mean of every loss here,
    where verl's kl_cov logs mean |logp - old| under that name.
    """
    if kl_cov_ratio <= 0:
        raise ValueError(f"kl_cov: kl_cov_ratio must be > 0, got {kl_cov_ratio}")
    log_ratio = _log_ratio(log_probs, old_log_probs, response_mask)
    ratio = torch.exp(torch.clamp(log_ratio, -MAX_LOG_RATIO, MAX_LOG_RATIO))
    valid = response_mask != 0
    cov = _token_covariance(advantages, log_probs, response_mask)
    key = torch.where(valid, cov, torch.full_like(cov, -torch.inf))
    penalised = valid & _largest(key, _token_budget(response_mask, kl_cov_ratio))
    pg = -advantages * ratio
    pg = torch.where(penalised, pg + ppo_kl_coef * log_ratio.abs(), pg)
    loss = agg_loss(_weighted(pg, is_weights), response_mask, loss_agg_mode, **(agg_kwargs or {}))
    return loss, _metrics(log_ratio, response_mask, penalised, torch.zeros_like(penalised))


@POLICY_LOSSES.register("dro")
def dro(
    old_log_probs: Tensor,
    log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    dro_beta: float | None = None,
    is_weights: Tensor | None = None,
    agg_kwargs: dict[str, Any] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DRO (Richemond et al. 2024, arXiv 2405.19107): l_t = -(A_t logp_t - beta/2 (logp_t - old_t)^2).

    The form verl uses: the quadratic log-ratio penalty replaces the clip; beta (dro_beta) has no default
    and must be > 0. The gradient -(A_t - beta (logp_t - old_t)) d logp_t is, up to the factor beta, that of DRO's squared
    residual 1/2 (A - beta log(pi / pi_old))^2 with the sampling policy as reference; on-policy it is
    REINFORCE's, and beta -> 0 gives REINFORCE. Nothing is clipped: pg_clipfrac and _lower are 0.
    """
    if dro_beta is None or dro_beta <= 0:
        raise ValueError(
            f"dro: dro_beta (the weight of the quadratic log-ratio penalty) must be > 0, got {dro_beta}; "
            "set actor.dro_beta"
        )
    log_ratio = _log_ratio(log_probs, old_log_probs, response_mask)
    pg = -(advantages * zero_padding(upcast(log_probs), response_mask) - 0.5 * dro_beta * log_ratio**2)
    loss = agg_loss(_weighted(pg, is_weights), response_mask, loss_agg_mode, **(agg_kwargs or {}))
    none = torch.zeros_like(response_mask, dtype=torch.bool)
    return loss, _metrics(log_ratio, response_mask, none, none)


def _tv_region(logp: Tensor, old: Tensor, advantages: Tensor, low: float, high: float) -> Tensor:
    """p - p_old <= high where A > 0, p_old - p <= low elsewhere (binary total variation)."""
    change = torch.exp(logp) - torch.exp(old)
    return torch.where(advantages > 0, change <= high, change >= -low)


def _binary_kl_region(logp: Tensor, old: Tensor, advantages: Tensor, low: float, high: float) -> Tensor:
    """KL(Bern(p_old) || Bern(p)) <= high (A > 0) / low (A <= 0), or p moved against the advantage."""
    p, p_old = torch.exp(logp), torch.exp(old)
    binary_kl = p_old * (old - logp) + (1 - p_old) * torch.log(
        (1 - p_old + BINARY_KL_EPS) / (1 - p + BINARY_KL_EPS)
    )
    return torch.where(advantages > 0, (binary_kl <= high) | (p <= p_old), (binary_kl <= low) | (p >= p_old))


def _dppo(
    region: Callable[[Tensor, Tensor, Tensor, float, float], Tensor],
    old_log_probs: Tensor,
    log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
    is_weights: Tensor | None,
    agg_kwargs: dict[str, Any] | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """l_t = -A_t sg(min(r_t, c)) logp_t inside the trust region `region` says, 0 outside."""
    log_ratio = _log_ratio(log_probs, old_log_probs, response_mask)
    ratio = torch.exp(torch.clamp(log_ratio, -MAX_LOG_RATIO, MAX_LOG_RATIO))
    # the region is judged on detached probabilities, in float32 at least; padding: p = p_old = 1
    logp = zero_padding(upcast(log_probs).detach(), response_mask)
    old = zero_padding(upcast(old_log_probs).detach(), response_mask)
    in_region = region(logp, old, advantages, clip_ratio_low, clip_ratio_high)
    weight = torch.clamp(ratio, max=clip_ratio_c).detach()
    pg = -advantages * weight * zero_padding(upcast(log_probs), response_mask)
    pg = torch.where(in_region, pg, torch.zeros_like(pg))
    loss = agg_loss(_weighted(pg, is_weights), response_mask, loss_agg_mode, **(agg_kwargs or {}))
    truncated = in_region & (ratio.detach() > clip_ratio_c)
    return loss, _metrics(log_ratio, response_mask, ~in_region, truncated)


@POLICY_LOSSES.register("dppo_tv")
def dppo_tv(
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
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO-Binary-TV (Qi et al. 2026, arXiv 2602.04879): l_t = -A_t sg(min(r_t, c)) logp_t, 0 off the region.

    The trust region bounds the probability, not the ratio: a token with A > 0 is dropped when
    p - p_old > clip_ratio_high, one with A <= 0 when p_old - p > clip_ratio_low (verl reuses the clip
    keys as these TV bounds; its example uses 0.15). A move against the advantage is never dropped.
    c = clip_ratio_c truncates the detached IS weight (verl passes actor.clip_ratio_c; the paper wants
    it large, verl's example sets 10000); the gradient of a kept token is -A min(r, c) d logp, PPO's
    unclipped one while r < c. pg_clipfrac = share dropped; pg_clipfrac_lower = share kept but r > c.
    """
    return _dppo(
        _tv_region,
        old_log_probs,
        log_probs,
        advantages,
        response_mask,
        loss_agg_mode=loss_agg_mode,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
        is_weights=is_weights,
        agg_kwargs=agg_kwargs,
    )


@POLICY_LOSSES.register("dppo_kl")
def dppo_kl(
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
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO-Binary-KL (Qi et al. 2026, arXiv 2602.04879): dppo_tv with a region on KL(Bern(p_old) || Bern(p)).

    KL = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p)) (1e-8 added inside the second
    log, as verl does, for p = 1). A token with A > 0 is dropped when KL > clip_ratio_high and p > p_old,
    one with A <= 0 when KL > clip_ratio_low and p < p_old (verl's example: 0.05 both).
    """
    return _dppo(
        _binary_kl_region,
        old_log_probs,
        log_probs,
        advantages,
        response_mask,
        loss_agg_mode=loss_agg_mode,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
        is_weights=is_weights,
        agg_kwargs=agg_kwargs,
    )


def policy_loss(name: str, *args: Any, **settings: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """(loss, metrics) = fn(old, logp, A, mask, ...) of the loss `name` on a bag of `settings` for any loss:
    it gets those its function takes, and a keyword no loss takes is an error. For tools and tests; the
    actor passes exactly what the loss's spec names (roles/actor.py)."""
    return POLICY_LOSSES.call_with(name, *args, **settings)


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
