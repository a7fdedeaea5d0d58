"""PF-PPO, policy filtration: the update trains on rows drawn again, with replacement, by their scores.

Shen and Zhang 2024, "Policy Filtration in RLHF to Fine-Tune LLM for Code Generation" (arXiv 2409.06957):
a reward model is least reliable for the middle of its range, so the samples it scores most and least
clearly get more of the update. After the advantages, B rows are drawn with replacement from the batch of
B, row i with probability w_i / sum_j w_j, w = weight(s) + 1e-8 (so an all-zero weight vector draws
uniformly), where s_i is row i's summed token-level score. The weights (`PF_PPO_WEIGHTS`, verl's
`algorithm.pf_ppo.reweight_method`):

  pow:         w = |s|^p  (p = weight_pow; both clear successes and clear failures are kept)
  max_min:     w = 1 where s is the batch's largest or smallest score, else 0 ("best-worst")
  max_random:  w = 0.4 where s is the batch's largest score, else 0.1 ("best-random")

As in verl, max_min and max_random compare scores over the whole batch; the paper picks the best / worst
response within each prompt's group. Unlike verl, the draw is seeded (`resample_indices` takes a
generator; the trainer seeds it from trainer.seed and the step), so a run and its resumption draw the same
rows.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tandem.algos.registry import PF_PPO_WEIGHTS

WEIGHT_FLOOR = 1e-8  # added to every weight: a row scored 0 under pow can still be drawn


@PF_PPO_WEIGHTS.register("pow")
def pow_weights(scores: Tensor, weight_pow: float) -> Tensor:
    """w = |s|^weight_pow."""
    return scores.abs().pow(weight_pow)


@PF_PPO_WEIGHTS.register("max_min")
def max_min_weights(scores: Tensor, weight_pow: float) -> Tensor:
    """w = 1 for the batch's best and worst scores, 0 for the rest (weight_pow unused)."""
    extreme = (scores == scores.max()) | (scores == scores.min())
    return extreme.to(scores.dtype)


@PF_PPO_WEIGHTS.register("max_random")
def max_random_weights(scores: Tensor, weight_pow: float) -> Tensor:
    """w = 0.4 for the batch's best score, 0.1 for the rest (weight_pow unused)."""
    best = scores == scores.max()
    return torch.where(best, torch.full_like(scores, 0.4), torch.full_like(scores, 0.1))


@torch.no_grad()
def pf_ppo_weights(scores: Tensor, method: str = "pow", weight_pow: float = 2.0) -> Tensor:
    """The unnormalised draw weights of the rows with sequence scores `scores` [B] (float64), floor included."""
    weights = PF_PPO_WEIGHTS.get(method)(scores.double(), weight_pow)
    return (weights + WEIGHT_FLOOR).clamp(min=WEIGHT_FLOOR)


@torch.no_grad()
def resample_indices(scores: Tensor, method: str, weight_pow: float, generator: torch.Generator) -> Tensor:
    """B row indices drawn with replacement by `pf_ppo_weights` from a batch of B rows (CPU, int64).

    Args:
        scores: [B] each row's summed token-level score.
        method: a name of `PF_PPO_WEIGHTS` (pow, max_min, max_random).
        weight_pow: pow's exponent, >= 0.
        generator: the CPU generator the draw takes its randomness from.
    """
    weights = pf_ppo_weights(scores.detach().cpu(), method, weight_pow)
    return torch.multinomial(weights, len(weights), replacement=True, generator=generator)
