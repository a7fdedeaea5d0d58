"""The Optimal Token Baseline (OTB; Li, Xu, Li et al., "The Optimal Token Baseline: Variance Reduction for
Long-Horizon LLM-RL", 2026) and its tool-integrated (multi-turn) variant, as verl names them.

Within a prompt group, the baseline at response position t weights each sample's reward-to-go G_t by the
"realized energy" W_t of its path so far:
    B*_t = sum_i G_t^(i) W_t^(i) / (sum_i W_t^(i) + eps),   W_t = sum_{j<=t} w_j,
    w_j  = 1 - 2 pi(y_j) + sum_v pi_v^2  (= ||e_y - pi||^2, the logit-gradient proxy of the score's norm),
and A_t = G_t - B*_t. pi(y_j) = exp(old_log_probs) and sum_v pi_v^2 (`sum_pi_squared`) come from the
old-log-prob pass (actor.calculate_sum_pi_squared). With rollout IS weights rho, w_j is scaled by rho_j^2.

`tir_optimal_token_baseline` aligns the samples of a group by their own model tokens, skipping the
observation tokens (response_mask 0) that tools and interactions inserted: position k is each sample's
k-th model token. On single-turn samples (contiguous masks) the two are the same.

A group of one (or one non-empty sample) has baseline 0, so its advantage is G_t, as in verl (and as
every Tandem group estimator gives a group of one its own score). Where Tandem differs from verl
(0.9.1): rows with no response tokens never count as group members in either variant (verl's plain variant counts them, which changes a group's
second-longest length under handle_zero_tail). Both variants default to handle_zero_tail=True, as
verl 0.9.1's functions do (its trainer passes nothing, so the default is what runs).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tandem.algos.advantages import _index, _prepare, _require
from tandem.algos.core import GroupIndex, group_min, group_sum, zero_padding
from tandem.algos.registry import ADV_ESTIMATORS


def reward_to_go(rewards: Tensor, mask: Tensor) -> Tensor:
    """G_t = sum_{j >= t} r_j m_j (undiscounted) at the row's tokens, 0 at padding."""
    return zero_padding(rewards * mask, mask).flip(-1).cumsum(-1).flip(-1) * mask


def path_energy(
    old_log_probs: Tensor, sum_pi_squared: Tensor, mask: Tensor, rollout_is_weights: Tensor | None
) -> Tensor:
    """W_t = sum_{j <= t} (1 - 2 pi(y_j) + sum_v pi_v^2) rho_j^2 m_j, per row."""
    w = 1 - 2 * old_log_probs.exp() + sum_pi_squared
    if rollout_is_weights is not None:
        w = w * rollout_is_weights.detach() ** 2
    return zero_padding(w * mask, mask).cumsum(-1)


def _group_max(values: Tensor, index: GroupIndex) -> Tensor:
    return -group_min(-values, index)


def otb_advantages(
    returns: Tensor, energy: Tensor, mask: Tensor, index: GroupIndex, handle_zero_tail: bool, epsilon: float
) -> Tensor:
    """A_t = (G_t - B*_t) m_t on aligned rows (position t means the same thing in every row of a group).

    handle_zero_tail: where one sample of a group is longer than all the others, its positions past the
    second-longest length have only itself to compare with (B*_t = G_t, A_t = 0); there the baseline is
    set to 0 instead, so those tokens learn from G_t. A group of one non-empty row has baseline 0 too.
    """
    lengths = mask.sum(-1)
    members = (lengths > 0).to(returns.dtype)
    count = group_sum(members, index)
    numerator = group_sum(returns * energy * mask, index)
    denominator = group_sum(energy * mask, index) + epsilon
    baseline = numerator / denominator
    if handle_zero_tail:
        longest = _group_max(lengths, index)
        at_longest = group_sum(((lengths == longest) & (lengths > 0)).to(returns.dtype), index)
        second = _group_max(torch.where(lengths == longest, torch.zeros_like(lengths), lengths), index)
        alone = (lengths == longest) & (at_longest == 1)
        positions = torch.arange(mask.shape[-1], device=mask.device)
        tail = alone[:, None] & (positions[None, :] >= second[:, None])
        baseline = torch.where(tail, torch.zeros_like(baseline), baseline)
    baseline = torch.where((count > 1)[:, None], baseline, torch.zeros_like(baseline))  # alone: A = G
    return torch.where((lengths > 0)[:, None], (returns - baseline) * mask, torch.zeros_like(returns))


def _inputs(
    name: str, token_level_rewards: Tensor, response_mask: Tensor, old_log_probs: Any, sum_pi_squared: Any
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    rewards, mask = _prepare(token_level_rewards, response_mask)
    meaning = "from the old-log-prob pass; set actor.calculate_sum_pi_squared=true"
    old = _require(old_log_probs, "old_log_probs", name, "the actor's log-probs of the samples").detach()
    spi = _require(sum_pi_squared, "sum_pi_squared", name, meaning).detach()
    return rewards, mask, old.to(rewards.dtype), spi.to(rewards.dtype)


@ADV_ESTIMATORS.register("optimal_token_baseline")
@torch.no_grad()
def optimal_token_baseline(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    index: GroupIndex | None = None,
    old_log_probs: Tensor | None = None,
    sum_pi_squared: Tensor | None = None,
    rollout_is_weights: Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
) -> tuple[Tensor, Tensor]:
    """OTB: A_t = G_t - sum_i G_t W_t / (sum_i W_t + eps) over the prompt's group; returns = G (see module)."""
    rewards, mask, old, spi = _inputs(
        "optimal_token_baseline", token_level_rewards, response_mask, old_log_probs, sum_pi_squared
    )
    returns = reward_to_go(rewards, mask)
    energy = path_energy(old, spi, mask, rollout_is_weights)
    index = _index(index, "optimal_token_baseline")
    return otb_advantages(returns, energy, mask, index, handle_zero_tail, epsilon), returns


def compact(values: Tensor, mask: Tensor) -> Tensor:
    """Each row's values at its mask's 1s, moved to the front in order (the rest 0): [B, T] -> [B, T]."""
    slot = (mask.cumsum(-1) - 1).clamp(min=0).long()
    kept = torch.where(mask != 0, values, torch.zeros_like(values))
    return torch.zeros_like(values).scatter_add_(-1, slot, kept)


def expand(compacted: Tensor, mask: Tensor) -> Tensor:
    """The inverse of `compact`: the k-th value goes back to the row's k-th masked position; 0 elsewhere."""
    slot = (mask.cumsum(-1) - 1).clamp(min=0).long()
    return torch.where(mask != 0, compacted.gather(-1, slot), torch.zeros_like(compacted))


@ADV_ESTIMATORS.register("tir_optimal_token_baseline")
@torch.no_grad()
def tir_optimal_token_baseline(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    index: GroupIndex | None = None,
    old_log_probs: Tensor | None = None,
    sum_pi_squared: Tensor | None = None,
    rollout_is_weights: Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
) -> tuple[Tensor, Tensor]:
    """Multi-turn OTB: the baseline of a sample's k-th model token pools the group's k-th model tokens
    (observation tokens skipped); returns = G at model tokens (see module)."""
    rewards, mask, old, spi = _inputs(
        "tir_optimal_token_baseline", token_level_rewards, response_mask, old_log_probs, sum_pi_squared
    )
    returns = reward_to_go(rewards, mask)
    energy = path_energy(old, spi, mask, rollout_is_weights)
    aligned = compact(mask, mask)
    index = _index(index, "tir_optimal_token_baseline")
    adv = otb_advantages(
        compact(returns, mask), compact(energy, mask), aligned, index, handle_zero_tail, epsilon
    )
    return expand(adv, mask), returns
