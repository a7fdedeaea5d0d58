"""The optimal token baseline (OTB) and its multi-turn variant, against values worked out by hand."""

import math

import pytest
import torch

from tandem.algos import compute_advantages, sum_pi_squared_from_logits
from tandem.algos.token_baseline import compact, expand

LOG_HALF, LOG_QUARTER = math.log(0.5), math.log(0.25)


def otb(name, rewards, mask, index, old, spi, **kw):
    return compute_advantages(name, rewards, mask, index=index, old_log_probs=old, sum_pi_squared=spi, **kw)


def two_samples_and_a_loner():
    """a: 2 tokens, pi = 0.5, sum pi^2 = 0.5 -> w = 0.5, W = [0.5, 1.0], reward 1 -> G = [1, 1];
    b: 1 token, pi = 0.25, sum pi^2 = 0.25 -> w = 0.75, W = [0.75], reward 0 -> G = [0];
    c: alone in its group: baseline 0, A = G = [3, 3] (as verl)."""
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 3.0]])
    old = torch.tensor([[LOG_HALF, LOG_HALF], [LOG_QUARTER, 0.0], [LOG_HALF, LOG_HALF]])
    spi = torch.tensor([[0.5, 0.5], [0.25, 0.0], [0.5, 0.5]])
    return rewards, mask, ["p", "p", "q"], old, spi


def test_otb_weights_each_return_by_its_path_energy():
    rewards, mask, index, old, spi = two_samples_and_a_loner()
    adv, returns = otb("optimal_token_baseline", rewards, mask, index, old, spi, handle_zero_tail=False)
    # t=0: B = (1 * 0.5 + 0 * 0.75) / (0.5 + 0.75) = 0.4; t=1: only a -> B = G_a = 1
    expected = torch.tensor([[0.6, 0.0], [-0.4, 0.0], [3.0, 3.0]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0], [0.0, 0.0], [3.0, 3.0]]))


def test_otb_zero_tail_gives_the_lone_longest_sample_its_return():
    rewards, mask, index, old, spi = two_samples_and_a_loner()
    adv, _ = otb("optimal_token_baseline", rewards, mask, index, old, spi)  # on by default, as verl
    # a is the only sample with a token at t=1 (second-longest length 1): baseline 0 there
    torch.testing.assert_close(adv, torch.tensor([[0.6, 1.0], [-0.4, 0.0], [3.0, 3.0]]))


def test_otb_scales_the_energy_by_the_squared_is_weight():
    rewards, mask, index, old, spi = two_samples_and_a_loner()
    rho = torch.tensor([[2.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    adv, _ = otb("optimal_token_baseline", rewards, mask, index, old, spi, rollout_is_weights=rho)
    # W_a(0) = 0.5 * 2^2 = 2: B(0) = 2 / (2 + 0.75); t=1 is a's zero tail (baseline 0, A = G_a = 1)
    b0 = 2 / 2.75
    torch.testing.assert_close(adv, torch.tensor([[1 - b0, 1.0], [-b0, 0.0], [3.0, 3.0]]))


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_a_group_of_one_gets_its_reward_to_go(name):
    # rollout.n=1: every row alone. a: model, observation, model, rewards (1, 0, 2) -> G = (3, 0, 2) at
    # model tokens; b: one token, reward -1; c: no response token (A = 0); d shares c's group, so b..d
    # has b as its one non-empty member. Baseline 0 everywhere: A = G (verl: "no baseline")
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    rewards = torch.tensor([[1.0, 0.0, 2.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    old, spi = torch.full((4, 3), LOG_HALF), torch.full((4, 3), 0.5)
    adv, returns = otb(name, rewards, mask, ["a", "b", "c", "b"], old, spi)
    expected = torch.tensor([[3.0, 0.0, 2.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(returns, expected)


def multi_turn_pair():
    """a: model, observation, model (reward 1 on its last token); b: model, model, padding (reward 0).
    Aligned by model tokens both are 2 long with W_a = [0.5, 1.0], W_b = [0.75, 1.5]."""
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    old = torch.tensor([[LOG_HALF, -9.0, LOG_HALF], [LOG_QUARTER, LOG_QUARTER, 0.0]])
    spi = torch.tensor([[0.5, 0.9, 0.5], [0.25, 0.25, 0.0]])
    return rewards, mask, ["p", "p"], old, spi


def test_tir_otb_pools_the_kth_model_tokens_and_skips_observations():
    rewards, mask, index, old, spi = multi_turn_pair()
    adv, returns = otb("tir_optimal_token_baseline", rewards, mask, index, old, spi)
    # k=0: (1 * 0.5 + 0) / (0.5 + 0.75) = 0.4; k=1: (1 * 1.0 + 0) / (1.0 + 1.5) = 0.4
    torch.testing.assert_close(adv, torch.tensor([[0.6, 0.0, 0.6], [-0.4, -0.4, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]))
    # the plain variant pools by absolute position, so a's second model token meets no one (A = 0)
    plain, _ = otb("optimal_token_baseline", rewards, mask, index, old, spi)
    assert plain[0, 2] == 0 and plain[1, 1] == 0


def test_the_two_variants_agree_on_single_turn_samples():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 3, 1, 4, 0, 5, 2, 2])
    mask = (torch.arange(5)[None, :] < lengths[:, None]).float()
    rewards = torch.randn(8, 5, generator=gen) * mask
    old = -torch.rand(8, 5, generator=gen)
    spi = torch.rand(8, 5, generator=gen) * 0.5
    index = [0, 0, 0, 0, 1, 1, 1, 1]
    for zero_tail in (False, True):
        kw = {"handle_zero_tail": zero_tail}
        plain = otb("optimal_token_baseline", rewards, mask, index, old, spi, **kw)
        tir = otb("tir_optimal_token_baseline", rewards, mask, index, old, spi, **kw)
        torch.testing.assert_close(tir, plain)


def test_compact_and_expand_are_inverse_on_masked_positions():
    mask = torch.tensor([[0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    values = torch.tensor([[9.0, 1.0, 9.0, 2.0], [3.0, 4.0, 5.0, 9.0]])
    torch.testing.assert_close(
        compact(values, mask), torch.tensor([[1.0, 2.0, 0.0, 0.0], [3.0, 4.0, 5.0, 0.0]])
    )
    torch.testing.assert_close(expand(compact(values, mask), mask), values * mask)


def test_otb_names_what_is_missing():
    rewards, mask, index, old, _ = two_samples_and_a_loner()
    with pytest.raises(ValueError, match="sum_pi_squared.*actor.calculate_sum_pi_squared=true"):
        otb("optimal_token_baseline", rewards, mask, index, old, None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_sum_pi_squared_from_logits(dtype):
    logits = torch.randn(3, 4, 11, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    logits[0, 0, :5] = float("-inf")
    expected = logits.softmax(-1).pow(2).sum(-1)
    got = sum_pi_squared_from_logits(logits.to(dtype), chunk_rows=2)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(got.double(), expected, rtol=tol, atol=tol)
