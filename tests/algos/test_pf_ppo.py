"""PF-PPO's draw weights (verl's algorithm.pf_ppo.reweight_method) against hand-computed values, and the
seeded draw: reproducible for a seed, and drawing each row about as often as its weight says."""

from typing import get_args

import pytest
import torch

from tandem.algos import PF_PPO_WEIGHTS, pf_ppo_weights, resample_indices
from tandem.config.schema import PFPPOMethod

# summed scores of 6 rows: two best (1.0), one worst (-2.0), a zero, and two in between
SCORES = torch.tensor([1.0, -0.5, 0.0, -2.0, 1.0, 0.5])
FLOOR = 1e-8


def test_the_three_methods_are_registered_and_the_config_takes_the_same_names():
    assert PF_PPO_WEIGHTS.names() == ["max_min", "max_random", "pow"] == sorted(get_args(PFPPOMethod))


def test_pow_weights_are_the_absolute_score_to_the_power_plus_the_floor():
    # |s|^2: 1, 0.25, 0, 4, 1, 0.25; a negative score weighs as its absolute value, a zero one gets the floor
    expected = torch.tensor([1.0, 0.25, 0.0, 4.0, 1.0, 0.25], dtype=torch.float64) + FLOOR
    assert torch.allclose(pf_ppo_weights(SCORES, "pow", 2.0), expected, rtol=0, atol=1e-15)
    # |s|^3: 1, 0.125, 0, 8, 1, 0.125
    cubed = torch.tensor([1.0, 0.125, 0.0, 8.0, 1.0, 0.125], dtype=torch.float64) + FLOOR
    assert torch.allclose(pf_ppo_weights(SCORES, "pow", 3.0), cubed, rtol=0, atol=1e-15)
    # power 0: every row alike (0^0 = 1)
    assert torch.equal(pf_ppo_weights(SCORES, "pow", 0.0), torch.full((6,), 1.0 + FLOOR, dtype=torch.float64))


def test_max_min_keeps_every_row_at_the_batch_best_or_worst_score():
    expected = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0], dtype=torch.float64) + FLOOR
    assert torch.equal(pf_ppo_weights(SCORES, "max_min", 2.0), expected)
    # all scores alike: each row is both best and worst
    same = pf_ppo_weights(torch.zeros(4), "max_min", 2.0)
    assert torch.equal(same, torch.full((4,), 1.0 + FLOOR, dtype=torch.float64))


def test_max_random_weighs_the_best_rows_four_times_the_others():
    expected = torch.tensor([0.4, 0.1, 0.1, 0.1, 0.4, 0.1], dtype=torch.float64) + FLOOR
    assert torch.allclose(pf_ppo_weights(SCORES, "max_random", 2.0), expected, rtol=0, atol=1e-15)


def test_an_unknown_method_names_the_known_ones():
    with pytest.raises(KeyError, match="unknown PF-PPO reweight method 'maxmin'. Did you mean 'max_min'"):
        pf_ppo_weights(SCORES, "maxmin", 2.0)


def _draw(seed: int, method: str = "pow") -> torch.Tensor:
    return resample_indices(SCORES, method, 2.0, torch.Generator().manual_seed(seed))


def test_the_draw_is_reproducible_for_a_seed_and_differs_between_seeds():
    first = _draw(7)
    assert first.dtype == torch.int64 and first.shape == (6,)
    assert torch.equal(first, _draw(7))
    assert any(not torch.equal(first, _draw(seed)) for seed in range(8, 12))
    # max_min never draws a row of weight 1e-8 in practice: only rows 0, 3 and 4
    assert set(_draw(7, "max_min").tolist()) <= {0, 3, 4}
    # a zero score under pow is drawn only by the floor: 1e-8 / 6.5 of a draw
    assert 2 not in torch.cat([_draw(seed) for seed in range(50)]).tolist()


def test_rows_are_drawn_in_proportion_to_their_weights():
    """4000 draws of 6 rows (24000 picks): each row's share within 0.01 of w_i / sum w (pow: 1, .25, 0, 4, 1, .25
    over 6.5)."""
    picks = torch.cat([_draw(seed) for seed in range(4000)])
    share = torch.bincount(picks, minlength=6).double() / len(picks)
    expected = torch.tensor([1.0, 0.25, 0.0, 4.0, 1.0, 0.25], dtype=torch.float64) / 6.5
    assert torch.allclose(share, expected, atol=0.01), (share, expected)
