"""Advantage estimators: (token_level_rewards, response_mask, ...) -> (advantages, returns), both (B, T).

Each estimator takes the keywords its spec in tandem/algo_options.py names (`index`, `values`,
`gamma`, ...: the advantage step passes exactly those) and keeps the defaults of the rest (`epsilon`);
no estimator swallows keywords it does not use. Outputs are 0 at padding (whatever the rewards hold there), carry no gradient,
and are float32 at least (bf16 / fp16 inputs are upcast).

Group-relative estimators (grpo, dr_grpo, grpo_passk, rloo, rloo_vectorized, opo, gpg, gdpo,
reinforce_plus_plus_baseline) compare a sample with the other samples of its prompt (`index` = the
prompt's uid); a group whose scores are all equal gets 0. A group of one (rollout.n=1) has nothing to
compare with: as in verl, its baseline is 0 (and its std 1), so its advantage is its own score (grpo:
s / (1 + eps)). Two exceptions give it 0, and Tandem refuses rollout.n=1 for them at start-up:
grpo_passk (verl raises there) and rloo_vectorized (verl gives 0, unlike its rloo).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from tandem.algos.core import (
    GroupIndex,
    group_ids,
    group_min,
    group_stats,
    group_sum,
    masked_sum,
    masked_whiten,
    upcast,
)
from tandem.algos.registry import ADV_ESTIMATORS


def _require(value: Any, what: str, estimator: str, meaning: str) -> Any:
    if value is None:
        raise ValueError(f"{estimator} needs `{what}` ({meaning})")
    return value


def _index(index: GroupIndex | None, estimator: str) -> GroupIndex:
    return _require(index, "index", estimator, "the group id of each sample, e.g. the prompt uid")


def _prepare(token_level_rewards: Tensor, response_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Rewards in float32 at least (a bf16 GAE / whitening loses digits), detached; mask in that dtype."""
    rewards = (
        upcast(token_level_rewards)
        if token_level_rewards.is_floating_point()
        else token_level_rewards.float()
    )
    return rewards.detach(), response_mask.to(rewards.dtype)


def _scores(rewards: Tensor, mask: Tensor) -> Tensor:
    return masked_sum(rewards, mask, dim=-1)


def _broadcast(per_seq: Tensor, mask: Tensor) -> Tensor:
    return per_seq[:, None] * mask


@ADV_ESTIMATORS.register("gae")
@torch.no_grad()
def gae(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """GAE: delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1}; R = A + V; A whitened.

    t+1 means the next valid token: padding inside a sequence is skipped, not a boundary.
    """
    values = _require(values, "values", "gae", "the critic's values on response tokens")
    rewards, mask = _prepare(token_level_rewards, response_mask)
    values = values.detach().to(rewards.dtype)
    batch, length = rewards.shape
    next_value = rewards.new_zeros(batch)
    next_adv = rewards.new_zeros(batch)
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(length)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        valid = mask[:, t] > 0
        next_value = torch.where(valid, values[:, t], next_value)
        next_adv = torch.where(valid, adv_t, next_adv)
        advantages[:, t] = adv_t
    # where(), not multiply: values at padding may be anything, and inf * 0 is NaN.
    valid = mask > 0
    advantages = torch.where(valid, advantages, torch.zeros_like(advantages))
    returns = torch.where(valid, advantages + values, torch.zeros_like(advantages))
    return masked_whiten(advantages, mask), returns


def _group_centered(
    rewards: Tensor,
    mask: Tensor,
    index: GroupIndex | None,
    estimator: str,
    *,
    norm_by_std: bool,
    epsilon: float,
) -> Tensor:
    return _group_centered_scores(
        _scores(rewards, mask), index, estimator, norm_by_std=norm_by_std, epsilon=epsilon
    )


def _group_centered_scores(
    scores: Tensor, index: GroupIndex | None, estimator: str, *, norm_by_std: bool, epsilon: float
) -> Tensor:
    """s_i - mean_g(s) (over std_g(s) + eps with norm_by_std) per sample; a group of one takes mean 0 and
    std 1, as verl's grpo does, so it gets s_i (over 1 + eps)."""
    mean, std, count = group_stats(scores, _index(index, estimator))
    single = count < 2
    centered = scores - torch.where(single, torch.zeros_like(mean), mean)
    if norm_by_std:
        centered = centered / (torch.where(single, torch.ones_like(std), std) + epsilon)
    return centered


def _group_relative(
    estimator: str,
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: GroupIndex | None,
    norm_by_std: bool,
    epsilon: float,
) -> tuple[Tensor, Tensor]:
    """The GRPO family: group-centred (optionally std-normalised) scores on every valid token; returns = A."""
    rewards, mask = _prepare(token_level_rewards, response_mask)
    adv = _group_centered(rewards, mask, index, estimator, norm_by_std=norm_by_std, epsilon=epsilon)
    advantages = _broadcast(adv, mask)
    return advantages, advantages.clone()


@ADV_ESTIMATORS.register("grpo")
@torch.no_grad()
def grpo(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    index: GroupIndex | None = None,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """GRPO: A_i = (s_i - mean_g(s)) / (std_g(s) + eps), s_i = sum_t r_i,t, unbiased std; returns = A."""
    return _group_relative("grpo", token_level_rewards, response_mask, index, norm_adv_by_std, epsilon)


@ADV_ESTIMATORS.register("dr_grpo")
@torch.no_grad()
def dr_grpo(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    index: GroupIndex | None = None,
    epsilon: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """Dr. GRPO: A_i = s_i - mean_g(s) (no std division, whatever `norm_adv_by_std` says); returns = A."""
    return _group_relative("dr_grpo", token_level_rewards, response_mask, index, False, epsilon)


def _leave_one_out(
    estimator: str,
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: GroupIndex | None,
    alone_keeps_score: bool,
) -> tuple[Tensor, Tensor]:
    """RLOO's advantage on every valid token; a group of one gets its score (alone_keeps_score) or 0."""
    rewards, mask = _prepare(token_level_rewards, response_mask)
    scores = _scores(rewards, mask)
    mean, _, count = group_stats(scores, _index(index, estimator))
    # s_i - (n s_bar - s_i) / (n - 1) = n / (n - 1) (s_i - s_bar): exactly 0 when the scores are equal.
    alone = scores if alone_keeps_score else torch.zeros_like(scores)
    adv = torch.where(count > 1, count / (count - 1).clamp(min=1) * (scores - mean), alone)
    advantages = _broadcast(adv, mask)
    return advantages, advantages.clone()


@ADV_ESTIMATORS.register("rloo")
@torch.no_grad()
def rloo(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    index: GroupIndex | None = None,
) -> tuple[Tensor, Tensor]:
    """RLOO: A_i = s_i - (sum_g s - s_i) / (n_g - 1), the mean of the other samples; a group of one has
    baseline 0 (A_i = s_i, as verl's rloo); returns = A."""
    return _leave_one_out("rloo", token_level_rewards, response_mask, index, alone_keeps_score=True)


@ADV_ESTIMATORS.register("rloo_vectorized")
@torch.no_grad()
def rloo_vectorized(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    index: GroupIndex | None = None,
) -> tuple[Tensor, Tensor]:
    """RLOO as verl's rloo_vectorized: rloo's A_i for groups of 2+, but 0 for a group of one (verl
    multiplies by n_g > 1); returns = A. With rollout.n=1 every advantage would be 0, so Tandem refuses
    that at start-up (verl runs it)."""
    return _leave_one_out(
        "rloo_vectorized", token_level_rewards, response_mask, index, alone_keeps_score=False
    )


def _discounted_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma G_{t+1} over valid tokens (padding skipped), G = 0 after the sequence ends."""
    running = rewards.new_zeros(rewards.shape[0])
    returns = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        valid = mask[:, t] > 0
        running = torch.where(valid, rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return returns * mask


@ADV_ESTIMATORS.register("reinforce_plus_plus")
@torch.no_grad()
def reinforce_plus_plus(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    gamma: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++: G_t = sum_{k>=t} gamma^(k-t) r_k; A = whiten_batch(G); returns = G."""
    rewards, mask = _prepare(token_level_rewards, response_mask)
    returns = _discounted_returns(rewards, mask, gamma)
    return masked_whiten(returns, mask), returns


@ADV_ESTIMATORS.register("reinforce_plus_plus_baseline")
@torch.no_grad()
def reinforce_plus_plus_baseline(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    index: GroupIndex | None = None,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline: A = whiten_batch(s_i - mean_g(s)) over tokens (mean 0 in a group of one); returns = A."""
    rewards, mask = _prepare(token_level_rewards, response_mask)
    adv = _group_centered(
        rewards, mask, index, "reinforce_plus_plus_baseline", norm_by_std=False, epsilon=0.0
    )
    advantages = masked_whiten(_broadcast(adv, mask), mask)
    return advantages, advantages.clone()


@ADV_ESTIMATORS.register("remax")
@torch.no_grad()
def remax(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    reward_baselines: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """ReMax: G_t = sum_{k>=t} r_k; A_t = G_t - b, b = the greedy response's score."""
    baselines = _require(
        reward_baselines, "reward_baselines", "remax", "the score of the greedy response to each prompt"
    )
    rewards, mask = _prepare(token_level_rewards, response_mask)
    returns = _discounted_returns(rewards, mask, 1.0)
    advantages = (returns - baselines.detach().to(rewards.dtype)[:, None]) * mask
    return advantages, returns


@ADV_ESTIMATORS.register("opo")
@torch.no_grad()
def opo(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    index: GroupIndex | None = None,
) -> tuple[Tensor, Tensor]:
    """OPO: A_i = s_i - b_g, b_g = sum_g(l_j s_j) / sum_g(l_j), l_j = response length (b = 0 in a group of
    one, as verl's opo); returns = A."""
    rewards, mask = _prepare(token_level_rewards, response_mask)
    scores = _scores(rewards, mask)
    index = _index(index, "opo")
    lengths = mask.sum(dim=-1)
    count = group_sum(torch.ones_like(scores), index)
    # Work on s - min_g(s) (same advantage) so that a group of equal scores gets exactly 0.
    shifted = scores - group_min(scores, index)
    total_length = group_sum(lengths, index)
    baseline = group_sum(lengths * shifted, index) / total_length.clamp(min=1e-8)
    keep = (count > 1) & (total_length > 0)
    adv = torch.where(keep, shifted - baseline, torch.where(count > 1, torch.zeros_like(scores), scores))
    advantages = _broadcast(adv, mask)
    return advantages, advantages.clone()


@ADV_ESTIMATORS.register("grpo_passk")
@torch.no_grad()
def grpo_passk(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    index: GroupIndex | None = None,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """Pass@k training (Chen et al. 2025, arXiv 2503.19595, as verl's grpo_passk): only the best sample
    of each group learns, A = (s_max - s_second) / (std_g(s) + eps) (no division with norm_adv_by_std
    false); every other sample gets 0. Ties go to the first best sample (then s_max - s_second = 0).
    A group of one gets 0 (verl raises: "Pass@k requires at least 2 samples per group"), and rollout.n=1
    is refused at start-up, since every advantage would be 0."""
    rewards, mask = _prepare(token_level_rewards, response_mask)
    scores = _scores(rewards, mask)
    inverse, num_groups = group_ids(_index(index, "grpo_passk"), scores.shape[0])
    inverse = inverse.to(scores.device)
    _, std, count = group_stats(scores, index)
    best = scores.new_full((num_groups,), -torch.inf).scatter_reduce(0, inverse, scores, reduce="amax")
    position = torch.arange(scores.shape[0], device=scores.device)
    is_best = scores == best[inverse]
    # no boolean indexing (a host round trip): positions of non-best samples count as "past the end"
    candidates = torch.where(is_best, position, torch.full_like(position, scores.shape[0]))
    first_best = torch.full((num_groups,), scores.shape[0], device=scores.device).scatter_reduce(
        0, inverse, candidates, reduce="amin"
    )
    winner = position == first_best[inverse]
    others = torch.where(winner, torch.full_like(scores, -torch.inf), scores)
    second = scores.new_full((num_groups,), -torch.inf).scatter_reduce(0, inverse, others, reduce="amax")
    margin = best[inverse] - second[inverse]
    if norm_adv_by_std:
        margin = margin / (std + epsilon)
    adv = torch.where(winner & (count > 1), margin, torch.zeros_like(scores))
    advantages = _broadcast(adv, mask)
    return advantages, advantages.clone()


@ADV_ESTIMATORS.register("gpg")
@torch.no_grad()
def gpg(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    index: GroupIndex | None = None,
) -> tuple[Tensor, Tensor]:
    """GPG (Chu et al. 2025, arXiv 2504.02546): A_i = alpha (s_i - mean_g(s)), alpha = B / (B - M).

    M counts the paper's "invalid" samples, those whose advantage is 0 for want of a signal: the samples
    of groups whose scores are all equal. B - M is the number of samples that carry one. No std
    normalisation (the paper's default). alpha rescales the batch mean so that groups with no signal
    do not dilute the gradient; B - M = 0 gives alpha = 1 (every advantage is 0 anyway). A group of one
    has baseline 0, as in verl, so its advantage is alpha * s_i; it counts in B - M unless s_i = 0.

    verl 0.9.1 differs on purpose in alpha: it takes alpha = B / (number of non-zero scores). The
    paper's accurate-gradient-estimation section defines alpha through the samples of groups with
    identical rewards, so Tandem follows the paper; with 0/1 rewards and every group mixed the two agree
    only when half the scores are 1 (with rollout.n=1, only groups of one, they agree exactly).
    """
    rewards, mask = _prepare(token_level_rewards, response_mask)
    scores = _scores(rewards, mask)
    mean, std, count = group_stats(scores, _index(index, "gpg"))
    single = count < 2
    baseline = torch.where(single, torch.zeros_like(mean), mean)
    informative = torch.where(single, scores != 0, std > 0)
    # Kept on the device (no .item() sync); where M = 0 every advantage is 0 whatever alpha is.
    alpha = scores.shape[0] / informative.sum().clamp(min=1).to(scores.dtype)
    adv = torch.where(informative, alpha * (scores - baseline), torch.zeros_like(scores))
    advantages = _broadcast(adv, mask)
    return advantages, advantages.clone()


@ADV_ESTIMATORS.register("gdpo")
@torch.no_grad()
def gdpo(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    index: GroupIndex | None = None,
    reward_components: Tensor | None = None,
    reward_weights: Sequence[float] | Tensor | None = None,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """GDPO (Liu et al. 2026, arXiv 2601.05242): A = whiten_batch(sum_k w_k z_k) over tokens, where
    z_k,i = (r_k,i - mean_g(r_k)) / (std_g(r_k) + eps) is GRPO's normalisation of reward component k
    alone (`reward_components[:, k]`, one column per term: correctness, format, ...); returns = A.

    Normalising each component before summing keeps reward combinations apart that GRPO on the summed
    reward maps to the same advantage (the paper's "reward advantage collapse"). The summed reward
    (`token_level_rewards`, hence a KL penalty in it) is not used. w defaults to all 1; std, eps and
    `norm_adv_by_std` are grpo's, a group of one included (z = r_k / (1 + eps)), as verl's gdpo.
    """
    components = _require(
        reward_components, "reward_components", "gdpo", "one column per reward term, shape (batch, terms)"
    )
    rewards, mask = _prepare(token_level_rewards, response_mask)
    components = components.detach().to(device=rewards.device, dtype=rewards.dtype)
    if components.ndim != 2 or components.shape[0] != rewards.shape[0]:
        raise ValueError(
            f"gdpo needs `reward_components` of shape (batch={rewards.shape[0]}, terms), "
            f"got {tuple(components.shape)}"
        )
    terms = components.shape[1]
    if reward_weights is None:
        weights = components.new_ones(terms)
    else:
        weights = torch.as_tensor(reward_weights, dtype=rewards.dtype).to(rewards.device)
    if weights.shape != (terms,):
        raise ValueError(
            f"gdpo: `reward_weights` has shape {tuple(weights.shape)} but there are {terms} reward components; "
            "give one weight per component"
        )
    combined = rewards.new_zeros(rewards.shape[0])
    for k in range(terms):
        z = _group_centered_scores(
            components[:, k], index, "gdpo", norm_by_std=norm_adv_by_std, epsilon=epsilon
        )
        combined = combined + weights[k] * z
    advantages = masked_whiten(_broadcast(combined, mask), mask)
    return advantages, advantages.clone()


def compute_advantages(
    name: str, token_level_rewards: Tensor, response_mask: Tensor, **inputs: Any
) -> tuple[Tensor, Tensor]:
    """(A, R) of the estimator `name` on a bag of `inputs` for any estimator: it gets those its function
    takes, and a keyword no estimator takes is an error. For tools and tests; the training step passes
    exactly what the estimator's spec names (trainer/advantage_step.py)."""
    return ADV_ESTIMATORS.call_with(name, token_level_rewards, response_mask, **inputs)
