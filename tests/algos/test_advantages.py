"""Advantage estimators against hand-computed values and a plain-loop GAE reference."""

import math

import numpy as np
import pytest
import torch

from tandem.algos import ADV_ESTIMATORS, compute_advantages, masked_whiten

GROUP_ESTIMATORS = [
    "grpo",
    "dr_grpo",
    "grpo_passk",
    "rloo",
    "rloo_vectorized",
    "opo",
    "gpg",
    "reinforce_plus_plus_baseline",
]


def outcome_rewards(scores, mask):
    """Token-level rewards with each score on the sequence's last valid token."""
    mask = torch.as_tensor(mask, dtype=torch.float32)
    rewards = torch.zeros_like(mask)
    last = mask.shape[1] - 1 - mask.flip(-1).argmax(-1)
    rewards[torch.arange(mask.shape[0]), last] = torch.as_tensor(scores, dtype=torch.float32)
    return rewards, mask


# Six samples, non-contiguous string uids: p1 = {0, 2, 4} scores (1, 0, 1); p2 = {1, 5} scores
# (0, 0) all equal; p3 = {3} a group of one (baseline 0: its score, as verl). Padding in the middle of the batch (rows 1, 3, 5).
UIDS = ["p1", "p2", "p1", "p3", "p1", "p2"]
SCORES = [1.0, 0.0, 0.0, 5.0, 1.0, 0.0]
MASK = [[1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0]]


# What the old-log-prob pass gives the optimal token baseline (pi(y) and sum_v pi_v^2 per token),
# and gdpo's rewards per term (one column each; tests/algos/test_gdpo.py checks its values).
ESTIMATOR_INPUTS = {
    "old_log_probs": torch.linspace(-2, -0.1, 18).reshape(6, 3),
    "sum_pi_squared": torch.linspace(0.2, 0.9, 18).reshape(6, 3),
    "reward_components": torch.tensor(
        [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [2.0, 1.0], [1.0, 1.0], [1.0, 0.0]]
    ),
}


def grouped_batch():
    rewards, mask = outcome_rewards(SCORES, MASK)
    rewards[1, 2] = 7.0  # junk at a padded position must be ignored
    return rewards, mask


def expect_broadcast(per_seq):
    return torch.tensor(per_seq)[:, None] * torch.tensor(MASK, dtype=torch.float32)


def test_every_estimator_declares_its_needs():
    for name in ADV_ESTIMATORS:
        info = ADV_ESTIMATORS.info(name)
        assert {"needs_critic", "needs_groups", "needs_reward_baselines"} <= set(info)
        assert set(info) <= {
            "needs_critic",
            "needs_groups",
            "needs_reward_baselines",
            "needs_sum_pi_squared",
            "needs_reward_components",
            "needs_two_per_group",
            "zero_for_group_of_one",
        }
        assert all(isinstance(v, bool) for v in info.values())
    assert ADV_ESTIMATORS.info("gae")["needs_critic"]
    assert ADV_ESTIMATORS.info("remax")["needs_reward_baselines"]
    assert all(ADV_ESTIMATORS.info(n)["needs_groups"] for n in GROUP_ESTIMATORS)
    assert [n for n in ADV_ESTIMATORS if ADV_ESTIMATORS.info(n).get("needs_two_per_group")] == ["grpo_passk"]
    assert [n for n in ADV_ESTIMATORS if ADV_ESTIMATORS.info(n).get("zero_for_group_of_one")] == [
        "rloo_vectorized"
    ]


def test_grpo_hand_computed():
    # p1: mean 2/3, deviations (1/3, -2/3, 1/3), unbiased var (1/9 + 4/9 + 1/9) / 2 = 1/3
    rewards, mask = grouped_batch()
    adv, ret = compute_advantages("grpo", rewards, mask, index=UIDS, epsilon=1e-6)
    # p3 alone: mean 0, std 1 (verl's choice) -> 5 / (1 + 1e-6)
    s = math.sqrt(1 / 3) + 1e-6
    expected = expect_broadcast([(1 / 3) / s, 0.0, (-2 / 3) / s, 5 / (1 + 1e-6), (1 / 3) / s, 0.0])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)


def test_grpo_without_std_and_dr_grpo():
    # score - group mean: p1 (1/3, -2/3, 1/3), p2 (0, 0), p3 alone -> 5 (baseline 0)
    rewards, mask = grouped_batch()
    expected = expect_broadcast([1 / 3, 0.0, -2 / 3, 5.0, 1 / 3, 0.0])
    adv, _ = compute_advantages("grpo", rewards, mask, index=UIDS, norm_adv_by_std=False)
    torch.testing.assert_close(adv, expected)
    adv, _ = compute_advantages("dr_grpo", rewards, mask, index=np.array(UIDS), norm_adv_by_std=True)
    torch.testing.assert_close(adv, expected)


def test_rloo_hand_computed():
    # p1: 1 - (0 + 1)/2 = 0.5; 0 - (1 + 1)/2 = -1; 1 - (1 + 0)/2 = 0.5; p3 alone: 5 - 0
    rewards, mask = grouped_batch()
    adv, ret = compute_advantages("rloo", rewards, mask, index=UIDS)
    torch.testing.assert_close(adv, expect_broadcast([0.5, 0.0, -1.0, 5.0, 0.5, 0.0]))
    torch.testing.assert_close(ret, adv)


def test_rloo_vectorized_is_rloo_except_for_a_group_of_one():
    # verl's rloo_vectorized: (n s_i - sum_g s) / max(n - 1, 1) * (n > 1). Group a = rows 0, 2, 3 with
    # scores (2, 0, 1), sum 3: (6 - 3) / 2 = 1.5, (0 - 3) / 2 = -1.5, (3 - 3) / 2 = 0, as rloo's
    # 2 - (0 + 1) / 2, 0 - (2 + 1) / 2, 1 - (2 + 0) / 2. Rows 1 (b: 5) and 4 (c: -1) are alone:
    # rloo gives the score, rloo_vectorized 0.
    mask = [[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1], [1, 1, 0]]
    rewards, mask_t = outcome_rewards([2.0, 5.0, 0.0, 1.0, -1.0], mask)
    index = ["a", "b", "a", "a", "c"]
    adv, ret = compute_advantages("rloo", rewards, mask_t, index=index)
    torch.testing.assert_close(adv, torch.tensor([1.5, 5.0, -1.5, 0.0, -1.0])[:, None] * mask_t)
    torch.testing.assert_close(ret, adv)
    adv, ret = compute_advantages("rloo_vectorized", rewards, mask_t, index=index)
    torch.testing.assert_close(adv, torch.tensor([1.5, 0.0, -1.5, 0.0, 0.0])[:, None] * mask_t)
    torch.testing.assert_close(ret, adv)


def test_opo_length_weighted_baseline():
    # a: lengths (1, 3), scores (1, 0) -> b = (1*1 + 3*0) / 4 = 0.25 -> (0.75, -0.25)
    # b: scores (2, 2) equal -> 0; c: alone -> baseline 0 -> 4
    mask = [[1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 1]]
    rewards, mask_t = outcome_rewards([1.0, 0.0, 2.0, 2.0, 4.0], mask)
    adv, _ = compute_advantages("opo", rewards, mask_t, index=["a", "a", "b", "b", "c"])
    expected = torch.tensor([0.75, -0.25, 0.0, 0.0, 4.0])[:, None] * mask_t
    torch.testing.assert_close(adv, expected)


def test_gpg_scales_by_informative_fraction():
    # groups 0: (1, 0) varies; 1: (2, 2) equal; 2: (0) alone with score 0 -> 2 informative of B = 5
    # alpha = 5 / 2; adv = 2.5 * (0.5, -0.5) = (1.25, -1.25), the rest 0
    rewards, mask = outcome_rewards([1.0, 0.0, 2.0, 2.0, 0.0], torch.ones(5, 2))
    adv, _ = compute_advantages("gpg", rewards, mask, index=torch.tensor([0, 0, 1, 1, 2]))
    torch.testing.assert_close(adv, torch.tensor([1.25, -1.25, 0.0, 0.0, 0.0])[:, None] * mask)


def test_gpg_a_group_of_one_has_baseline_zero_and_counts_as_informative():
    # as above but group 2 is (9) alone: baseline 0, informative (non-zero) -> 3 of B = 5, alpha = 5/3
    # adv = 5/3 * (0.5, -0.5, 0, 0, 9) = (5/6, -5/6, 0, 0, 15)
    rewards, mask = outcome_rewards([1.0, 0.0, 2.0, 2.0, 9.0], torch.ones(5, 2))
    adv, _ = compute_advantages("gpg", rewards, mask, index=torch.tensor([0, 0, 1, 1, 2]))
    torch.testing.assert_close(adv, torch.tensor([5 / 6, -5 / 6, 0.0, 0.0, 15.0])[:, None] * mask)


def test_gpg_no_informative_group_is_zero():
    rewards, mask = outcome_rewards([1.0, 1.0, 0.0], torch.ones(3, 2))
    adv, _ = compute_advantages("gpg", rewards, mask, index=[0, 0, 1])
    assert torch.equal(adv, torch.zeros(3, 2))


def test_reinforce_plus_plus_baseline_hand_computed():
    # centred scores (0.5, -0.5, 0, 0, 0) on 2 tokens each: 10 tokens, mean 0, sum sq 4 * 0.25 = 1
    # unbiased var 1/9 -> whitened 0.5 / (1/3) = 1.5 (the loner scores 0: baseline 0 leaves it 0)
    rewards, mask = outcome_rewards([1.0, 0.0, 2.0, 2.0, 0.0], torch.ones(5, 2))
    adv, _ = compute_advantages("reinforce_plus_plus_baseline", rewards, mask, index=[0, 0, 1, 1, 2])
    expected = torch.tensor([1.5, -1.5, 0.0, 0.0, 0.0])[:, None].expand(5, 2)
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=1e-6)


def test_reinforce_plus_plus_hand_computed():
    # gamma 0.5; row 0 r (1, 0, 2): G = (1 + 0.5 * 1, 0 + 0.5 * 2, 2) = (1.5, 1, 2)
    # row 1 r (0, 4, junk) mask (1, 1, 0): G = (2, 4, 0)
    # whiten over 1.5, 1, 2, 2, 4: mean 2.1, sq dev .36 + 1.21 + .01 + .01 + 3.61 = 5.2, var 1.3
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 4.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = compute_advantages("reinforce_plus_plus", rewards, mask, gamma=0.5)
    torch.testing.assert_close(ret, torch.tensor([[1.5, 1.0, 2.0], [2.0, 4.0, 0.0]]))
    expected = (ret - 2.1) / math.sqrt(1.3) * mask
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=1e-6)


def test_reinforce_plus_plus_skips_middle_padding():
    # mask (1, 0, 1), r (1, 5, 2), gamma 0.5: G_2 = 2, G_0 = 1 + 0.5 * 2 = 2, G_1 = 0 (padding)
    _, ret = compute_advantages(
        "reinforce_plus_plus", torch.tensor([[1.0, 5.0, 2.0]]), torch.tensor([[1.0, 0.0, 1.0]]), gamma=0.5
    )
    torch.testing.assert_close(ret, torch.tensor([[2.0, 0.0, 2.0]]))


def test_remax_hand_computed():
    # returns = reverse cumsum: row 0 (0, 1, 2) -> (3, 3, 2); row 1 (3, junk, junk) mask (1, 0, 0) -> (3, 0, 0)
    # baselines (1, 5): adv (2, 2, 1), (-2, 0, 0)
    rewards = torch.tensor([[0.0, 1.0, 2.0], [3.0, 8.0, 8.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv, ret = compute_advantages("remax", rewards, mask, reward_baselines=torch.tensor([1.0, 5.0]))
    torch.testing.assert_close(ret, torch.tensor([[3.0, 3.0, 2.0], [3.0, 0.0, 0.0]]))
    torch.testing.assert_close(adv, torch.tensor([[2.0, 2.0, 1.0], [-2.0, 0.0, 0.0]]))


def gae_reference(rewards, values, mask, gamma, lam):
    """Plain Python loop over each row's valid tokens."""
    advantages = [[0.0] * len(row) for row in rewards]
    for i in range(len(rewards)):
        valid = [t for t in range(len(rewards[i])) if mask[i][t]]
        next_value, next_adv = 0.0, 0.0
        for t in reversed(valid):
            delta = rewards[i][t] + gamma * next_value - values[i][t]
            next_adv = delta + gamma * lam * next_adv
            next_value = values[i][t]
            advantages[i][t] = next_adv
    return torch.tensor(advantages, dtype=torch.float64)


def test_gae_hand_computed_with_middle_padding():
    # valid t0, t2 (t1 padding, junk 99); gamma .9, lam .8
    # t2: delta = 1 - 0.4 = 0.6 -> A2 = 0.6; t0: delta = 0 + .9 * .4 - .2 = .16 -> A0 = .16 + .72 * .6 = .592
    # returns = A + V = (.792, 0, 1.0)
    rewards = torch.tensor([[0.0, 99.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.2, 99.0, 0.4]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0, 1.0]], dtype=torch.float64)
    _, ret = compute_advantages("gae", rewards, mask, values=values, gamma=0.9, lam=0.8)
    torch.testing.assert_close(ret, torch.tensor([[0.792, 0.0, 1.0]], dtype=torch.float64))


def test_gae_matches_loop_reference():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    values = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    mask = torch.tensor(
        [[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 1, 1, 0, 1], [0, 0, 0, 0, 0, 0]], dtype=torch.float64
    )
    values[3] = float("inf")  # an all-padding row with garbage values: still no NaN
    adv, ret = compute_advantages("gae", rewards, mask, values=values, gamma=0.95, lam=0.9)
    raw = gae_reference(rewards.tolist(), values.tolist(), mask.tolist(), 0.95, 0.9)
    torch.testing.assert_close(ret, torch.where(mask > 0, raw + values, 0.0))
    torch.testing.assert_close(adv, masked_whiten(raw, mask))
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()


def test_missing_inputs_name_what_is_needed():
    rewards, mask = outcome_rewards([1.0, 0.0], torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"gae needs `values` \(the critic's values"):
        compute_advantages("gae", rewards, mask)
    with pytest.raises(ValueError, match="remax needs `reward_baselines`"):
        compute_advantages("remax", rewards, mask)
    for name in GROUP_ESTIMATORS:
        with pytest.raises(ValueError, match=f"{name} needs `index`"):
            compute_advantages(name, rewards, mask)


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_equal_rewards_give_zero(name):
    rewards, mask = outcome_rewards([3.0, 3.0, 2.0, 2.0], [[1, 1], [1, 0], [1, 1], [1, 1]])
    adv, ret = compute_advantages(name, rewards, mask, index=["x", "x", "z", "z"])
    assert torch.equal(adv, torch.zeros_like(adv))
    assert torch.isfinite(ret).all()


# Groups of one (rollout.n=1) as verl computes them: baseline (mean) 0 and std 1, so the advantage is
# the score. Rows x = 1 (2 tokens), y = 3 (1 token), z = (2, 2) equal. grpo: s / (1 + 1e-6);
# gpg: x, y informative (non-zero), z not: alpha = 4 / 2 -> (2, 6); reinforce_plus_plus_baseline:
# tokens (1, 1, 3, 0, 0, 0, 0): mean 5/7, unbiased var (2 (2/7)^2 + (16/7)^2 + 4 (5/7)^2) / 6 = 26/21.
# grpo_passk: 0 (verl raises for a group of one); rloo_vectorized: 0 (verl's multiplies by n > 1). Both
# refuse rollout.n=1 at start-up.
_RPP = [(1 - 5 / 7) / math.sqrt(26 / 21), (3 - 5 / 7) / math.sqrt(26 / 21), (0 - 5 / 7) / math.sqrt(26 / 21)]
GROUP_OF_ONE = {
    "grpo": [1 / (1 + 1e-6), 3 / (1 + 1e-6), 0.0],
    "dr_grpo": [1.0, 3.0, 0.0],
    "rloo": [1.0, 3.0, 0.0],
    "rloo_vectorized": [0.0, 0.0, 0.0],
    "opo": [1.0, 3.0, 0.0],
    "gpg": [2.0, 6.0, 0.0],
    "reinforce_plus_plus_baseline": _RPP,
    "grpo_passk": [0.0, 0.0, 0.0],
}


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_a_group_of_one_beside_larger_groups(name):
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    rewards, _ = outcome_rewards([1.0, 3.0, 2.0, 2.0], mask)
    adv, ret = compute_advantages(name, rewards, mask, index=["x", "y", "z", "z"])
    x, y, z = GROUP_OF_ONE[name]
    torch.testing.assert_close(adv, torch.tensor([x, y, z, z])[:, None] * mask)
    torch.testing.assert_close(ret, adv)


# rollout.n=1: every sample alone, scores (1, 3, 0, -2) on 2, 1, 3, 2 tokens. The advantage verl's
# core_algos.py (b178a3cd) gives each, per sample, for every group estimator it registers:
#   grpo: mean 0, std 1 -> s / (1 + 1e-6)
#   grpo_passk: verl raises ("Pass@k requires at least 2 samples per group"); Tandem gives 0
#   reinforce_plus_plus_baseline: mean 0, then whitened over the 8 tokens (1, 1, 3, 0, 0, 0, -2, -2):
#     mean 1/8, unbiased var 18.875 / 7 -> (s - 0.125) / sqrt(18.875 / 7 + 1e-8)
#   rloo: baseline 0 -> s; rloo_vectorized: times (n > 1) -> 0
#   opo: baseline 0 -> s
#   gpg: mean 0, alpha = B / (non-zero scores) = 4 / 3 -> 4/3 s (Tandem's B / (B - M) agrees here)
#   optimal_token_baseline, tir_optimal_token_baseline: baseline 0 -> G_t = s on every token
# grpo_vectorized is the one verl group estimator Tandem does not register (its group of one is grpo's).
VERL_GROUP_ESTIMATORS_MISSING = {"grpo_vectorized"}
VERL_GROUP_OF_ONE = {
    "grpo": [0.999999000001, 2.999997000003, 0.0, -1.999998000002],
    "grpo_passk": [0.0, 0.0, 0.0, 0.0],
    "reinforce_plus_plus_baseline": [0.5328605787, 1.7508276156, -0.0761229398, -1.2940899768],
    "rloo": [1.0, 3.0, 0.0, -2.0],
    "rloo_vectorized": [0.0, 0.0, 0.0, 0.0],
    "opo": [1.0, 3.0, 0.0, -2.0],
    "gpg": [1.3333333333, 4.0, 0.0, -2.6666666667],
    "optimal_token_baseline": [1.0, 3.0, 0.0, -2.0],
    "tir_optimal_token_baseline": [1.0, 3.0, 0.0, -2.0],
}


def test_every_verl_group_estimator_is_in_the_group_of_one_table():
    # verl's AdvantageEstimator names at b178a3cd, less gae, reinforce_plus_plus and remax (no groups)
    verl_group_names = {
        "grpo",
        "grpo_vectorized",
        "grpo_passk",
        "reinforce_plus_plus_baseline",
        "rloo",
        "rloo_vectorized",
        "opo",
        "gpg",
        "optimal_token_baseline",
        "tir_optimal_token_baseline",
    }
    assert set(VERL_GROUP_OF_ONE) == verl_group_names - VERL_GROUP_ESTIMATORS_MISSING
    assert all(ADV_ESTIMATORS.info(name)["needs_groups"] for name in VERL_GROUP_OF_ONE)
    assert not VERL_GROUP_ESTIMATORS_MISSING & set(ADV_ESTIMATORS)


@pytest.mark.parametrize("name", sorted(VERL_GROUP_OF_ONE))
def test_one_sample_per_prompt_gives_verls_advantage(name):
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    rewards, _ = outcome_rewards([1.0, 3.0, 0.0, -2.0], mask)
    token_inputs = {  # what the old-log-prob pass gives OTB; a group of one ignores them
        "old_log_probs": torch.linspace(-2, -0.1, 12).reshape(4, 3),
        "sum_pi_squared": torch.linspace(0.2, 0.9, 12).reshape(4, 3),
    }
    adv, ret = compute_advantages(name, rewards, mask, index=["p0", "p1", "p2", "p3"], **token_inputs)
    expected = torch.tensor(VERL_GROUP_OF_ONE[name])[:, None] * mask
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, adv)  # OTB's returns are G_t, here the same numbers


@pytest.mark.parametrize("name", sorted(ADV_ESTIMATORS))
def test_zero_at_padding_and_no_grad(name):
    rewards, mask = grouped_batch()
    rewards.requires_grad_(True)
    kwargs = {
        "index": UIDS,
        "values": torch.randn(6, 3),
        "reward_baselines": torch.ones(6),
        **ESTIMATOR_INPUTS,
    }
    adv, ret = compute_advantages(name, rewards, mask, **kwargs)
    assert adv.shape == ret.shape == (6, 3)
    assert torch.equal(adv * (1 - mask), torch.zeros_like(adv))
    assert torch.equal(ret * (1 - mask), torch.zeros_like(ret))
    assert not adv.requires_grad and torch.isfinite(adv).all()


@pytest.mark.parametrize("garbage", [float("inf"), float("nan")])
@pytest.mark.parametrize("name", sorted(ADV_ESTIMATORS))
def test_garbage_rewards_at_padding_ignored(name, garbage):
    # before the fix: the group estimators summed rewards * mask, and inf * 0 = NaN
    rewards, mask = grouped_batch()
    kwargs = {
        "index": UIDS,
        "values": torch.linspace(-1, 1, 18).reshape(6, 3),
        "reward_baselines": torch.ones(6),
        **ESTIMATOR_INPUTS,
    }
    clean_adv, clean_ret = compute_advantages(name, rewards, mask, **kwargs)
    dirty = torch.where(mask > 0, rewards, torch.tensor(garbage))
    adv, ret = compute_advantages(name, dirty, mask, **kwargs)
    torch.testing.assert_close(adv, clean_adv)
    torch.testing.assert_close(ret, clean_ret)


@pytest.mark.parametrize("name", sorted(ADV_ESTIMATORS))
def test_low_precision_rewards_computed_in_float32(name):
    # bf16 rewards / values: the result is the float32 one of the same numbers, not a bf16 rounding
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(6, 3, generator=gen).bfloat16()
    values = torch.randn(6, 3, generator=gen).bfloat16()
    mask = torch.tensor(MASK, dtype=torch.float32)
    kwargs = {
        "index": UIDS,
        "gamma": 0.99,
        "lam": 0.95,
        "reward_baselines": torch.ones(6),
        **ESTIMATOR_INPUTS,
    }
    adv, ret = compute_advantages(name, rewards, mask, values=values, **kwargs)
    ref_adv, ref_ret = compute_advantages(name, rewards.float(), mask, values=values.float(), **kwargs)
    assert adv.dtype == ret.dtype == torch.float32
    torch.testing.assert_close(adv, ref_adv)
    torch.testing.assert_close(ret, ref_ret)


def test_grpo_passk_only_the_best_sample_learns_its_margin():
    # p1 = rows 0, 2, 4 scores (1, 0, 1): tie at 1, the first best (row 0) gets (1 - 1) / std = 0
    # q = rows 1, 3, 5 scores (3, 0.5, 2): row 1 gets (3 - 2) / std(3, .5, 2); rows 3 and 5 get 0
    # r = row 6 alone: 0
    scores = [1.0, 3.0, 0.0, 0.5, 1.0, 2.0, 4.0]
    rewards, mask = outcome_rewards(scores, torch.ones(7, 2))
    index = ["p1", "q", "p1", "q", "p1", "q", "r"]
    std_q = float(np.std([3.0, 0.5, 2.0], ddof=1))
    adv, returns = compute_advantages("grpo_passk", rewards, mask, index=index)
    expected = torch.tensor([0.0, 1.0 / (std_q + 1e-6), 0.0, 0.0, 0.0, 0.0, 0.0])[:, None] * mask
    torch.testing.assert_close(adv, expected)
    assert torch.equal(adv, returns)
    raw, _ = compute_advantages("grpo_passk", rewards, mask, index=index, norm_adv_by_std=False)
    torch.testing.assert_close(raw[:, 0], torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]))
