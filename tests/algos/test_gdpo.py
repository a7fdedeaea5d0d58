"""GDPO: each reward component group-normalised alone, weighted, summed, whitened over the batch's tokens."""

import math

import pytest
import torch

from tandem.algos import ADV_ESTIMATORS, compute_advantages, masked_mean, masked_var

# Two prompts x three samples, components (correct, format), weights (1, 0.5).
# a = rows 0-2: correct (1, 0, 0) -> z = (2, -1, -1) c; format (1, 1, 0) -> z = (1, 1, -2) c
# b = rows 3-5: correct (1, 1, 1) constant -> z = 0;   format (0, 1, 0) -> z = (-1, 2, -1) c
# with c = (1/3) / (std + eps), std = sqrt(1/3) in both: sum_k w_k z_k = (2.5, -0.5, -2, -0.5, 1, -0.5) c
INDEX = ["a", "a", "a", "b", "b", "b"]
COMPONENTS = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [1.0, 0.0]])
WEIGHTS = [1.0, 0.5]
COMBINED = [2.5, -0.5, -2.0, -0.5, 1.0, -0.5]  # in units of c
# rows 0 and 3 have two response tokens, the others one (padding after)
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0], [1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])


def gdpo(components=COMPONENTS, mask=MASK, index=INDEX, **kw):
    rewards = torch.zeros_like(mask)  # the summed reward is not read
    return compute_advantages("gdpo", rewards, mask, index=index, reward_components=components, **kw)


def test_gdpo_hand_computed_with_masked_whitening():
    # Tokens (units of c): 2.5, 2.5, -0.5, -2, -0.5, -0.5, 1, -0.5; mean 2/8 = 0.25;
    # squared deviations sum to 18, unbiased variance 18/7 c^2; c cancels in the whitening.
    adv, ret = gdpo(reward_weights=WEIGHTS)
    expected = (torch.tensor(COMBINED) - 0.25)[:, None] / math.sqrt(18 / 7) * MASK
    torch.testing.assert_close(adv, expected)
    assert torch.equal(ret, adv)
    # whitened over valid tokens only: mean 0 and unbiased variance 1 there, 0 at padding
    torch.testing.assert_close(masked_mean(adv, MASK), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(masked_var(adv, MASK), torch.tensor(1.0))
    assert torch.equal(adv * (1 - MASK), torch.zeros_like(adv))


def test_weights_default_to_one():
    adv, _ = gdpo()
    torch.testing.assert_close(adv, gdpo(reward_weights=[1.0, 1.0])[0])
    assert not torch.allclose(adv, gdpo(reward_weights=WEIGHTS)[0])


def test_a_component_constant_in_its_group_contributes_nothing():
    shifted = COMPONENTS.clone()
    shifted[3:, 0] = 7.0  # b's correctness: another constant
    torch.testing.assert_close(gdpo(shifted, reward_weights=WEIGHTS)[0], gdpo(reward_weights=WEIGHTS)[0])


def test_gdpo_keeps_reward_combinations_apart_that_grpo_collapses():
    # The paper's example: g1 samples (0, 0) and (0, 1), g2 samples (0, 0) and (1, 1). Summed: (0, 1)
    # and (0, 2), which GRPO maps to the same (-1, 1) / sqrt(2); GDPO gives g2's winner twice g1's.
    components = torch.tensor([[0.0, 0.0], [0.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
    index, mask = ["g1", "g1", "g2", "g2"], torch.ones(4, 1)
    summed = components.sum(-1, keepdim=True)
    grpo, _ = compute_advantages("grpo", summed, mask, index=index)
    torch.testing.assert_close(grpo[:2], grpo[2:])
    adv, _ = gdpo(components, mask, index)
    # combined (-1, 1, -2, 2) c: mean 0, unbiased variance 10/3 c^2
    expected = torch.tensor([-1.0, 1.0, -2.0, 2.0])[:, None] / math.sqrt(10 / 3)
    torch.testing.assert_close(adv, expected)


def test_without_std_normalisation_components_are_only_centred():
    # b's format (0, 3, 0) unscaled: centred (-1, 2, -1), as with (0, 1, 0) scaled by its std; a's weight 0
    components = torch.tensor([[1.0, 0.0], [0.0, 3.0], [0.0, 0.0]])
    index, mask = ["b", "b", "b"], torch.ones(3, 1)
    raw, _ = gdpo(components, mask, index, reward_weights=[0.0, 1.0], norm_adv_by_std=False)
    scaled, _ = gdpo(components / 3, mask, index, reward_weights=[0.0, 1.0])
    torch.testing.assert_close(raw, scaled)


def test_a_group_of_one_adds_its_weighted_rewards_before_the_whitening():
    components = torch.cat([COMPONENTS, torch.tensor([[5.0, 9.0]])])
    mask = torch.cat([MASK, torch.tensor([[1.0, 1.0]])])
    adv, _ = gdpo(components, mask, [*INDEX, "alone"], reward_weights=WEIGHTS)
    # the loner's z_k = r_k / (1 + eps) (mean 0, std 1, as verl's grpo step): 5 + 0.5 * 9 = 9.5;
    # the others are COMBINED in units of c = (1/3) / (sqrt(1/3) + eps); then one whitening over all
    c = (1 / 3) / (math.sqrt(1 / 3) + 1e-6)
    combined = torch.tensor([*(x * c for x in COMBINED), 9.5 / (1 + 1e-6)])
    tokens = combined[:, None].expand(-1, 2)[mask > 0]
    mean, std = tokens.mean(), tokens.std()
    torch.testing.assert_close(adv, (combined - mean)[:, None] / std * mask)


def test_missing_or_mismatched_inputs_are_named():
    with pytest.raises(ValueError, match="gdpo needs `reward_components`"):
        compute_advantages("gdpo", torch.zeros(6, 2), MASK, index=INDEX)
    with pytest.raises(ValueError, match="gdpo needs `index`"):
        gdpo(index=None)
    with pytest.raises(ValueError, match=r"shape \(batch=6, terms\), got \(6,\)"):
        gdpo(COMPONENTS[:, 0])
    with pytest.raises(
        ValueError, match=r"`reward_weights` has shape \(3,\) but there are 2 reward components"
    ):
        gdpo(reward_weights=[1.0, 1.0, 1.0])


def test_registry_flags_name_the_components():
    info = ADV_ESTIMATORS.info("gdpo")
    assert info["needs_groups"] and info["needs_reward_components"] and not info["needs_critic"]
