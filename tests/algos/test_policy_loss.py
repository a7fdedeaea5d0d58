"""Policy losses and the value loss: hand-computed values, hand-derived gradients, gradcheck."""

import math

import pytest
import torch

from tandem.algos import POLICY_LOSSES, gspo, policy_loss, reinforce, value_loss, vanilla
from tandem.config import ConfigError, load_config


def ppo_batch():
    # tokens: ratio r, advantage A                (clip 0.2, dual clip c = 3)
    # t0 r 1.5 A +1: max(-1.5, -1.2) = -1.2      clipped
    # t1 r 0.9 A +1: max(-0.9, -0.9) = -0.9
    # t2 r 0.5 A -1: max(0.5, 0.8)   = 0.8       clipped, under c: 0.8
    # t3 r 5.0 A -1: max(5.0, 1.2)   = 5 -> min(5, 3) = 3   dual clip
    # t4 r 1.1 A -2: max(2.2, 2.2)   = 2.2, under 6
    # t5 padding (r 100, A 5)
    ratios = [1.5, 0.9, 0.5, 5.0, 1.1, 100.0]
    log_probs = torch.tensor([[math.log(r) for r in ratios]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 6, dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, -2.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    return old, log_probs, adv, mask


def test_vanilla_hand_computed():
    old, logp, adv, mask = ppo_batch()
    loss, metrics = vanilla(old, logp, adv, mask)
    # token-mean: (-1.2 - 0.9 + 0.8 + 3 + 2.2) / 5 = 3.9 / 5
    assert loss.item() == pytest.approx(0.78)
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 5)
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(1 / 5)
    # ppo_kl = mean(old - logp) = -log(1.5 * 0.9 * 0.5 * 5 * 1.1) / 5
    assert metrics["ppo_kl"].item() == pytest.approx(-math.log(3.7125) / 5)
    assert not any(m.requires_grad for m in metrics.values())


def test_vanilla_gradient_zero_on_clipped_tokens():
    old, logp, adv, mask = ppo_batch()
    loss, _ = vanilla(old, logp, adv, mask)
    loss.backward()
    # d(-A r)/dlogp = -A r on unclipped tokens, / 5 tokens: t1 -0.9/5, t4 2.2/5; clipped / dual / pad: 0
    expected = torch.tensor([[0.0, -0.18, 0.0, 0.0, 0.44, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, expected)


def test_vanilla_asymmetric_clip_and_is_weights():
    old, logp, adv, mask = ppo_batch()
    # clip_ratio_high 0.6: t0 r 1.5 now unclipped -> -1.5; total (-1.5 - 0.9 + 0.8 + 3 + 2.2) / 5 = 0.72
    loss, _ = vanilla(old, logp, adv, mask, clip_ratio_high=0.6)
    assert loss.item() == pytest.approx(0.72)
    # IS weights (2, 1, 1, 1, 0.5, 7): (-2.4 - 0.9 + 0.8 + 3 + 1.1) / 5 = 0.32; weights get no gradient
    weights = torch.tensor([[2.0, 1.0, 1.0, 1.0, 0.5, 7.0]], dtype=torch.float64, requires_grad=True)
    loss, _ = vanilla(old, logp, adv, mask, is_weights=weights)
    assert loss.item() == pytest.approx(0.32)
    loss.backward()
    assert weights.grad is None


def test_vanilla_rejects_bad_dual_clip():
    old, logp, adv, mask = ppo_batch()
    with pytest.raises(ValueError, match="clip_ratio_c"):
        vanilla(old, logp, adv, mask, clip_ratio_c=1.0)


def test_vanilla_huge_log_ratio_is_finite():
    old = torch.zeros(1, 2)
    logp = torch.tensor([[500.0, -500.0]], requires_grad=True)
    loss, _ = vanilla(old, logp, torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()


def gspo_batch():
    # row 0: logp - old = (0.2, 0.0, 0.1), mean 0.1 -> s0 = e^0.1 = 1.10517 (inside 0.8..1.2)
    # row 1: (0.0, 0.6, pad 99), mean 0.3 -> s1 = e^0.3 = 1.34986 -> clipped at 1.2; A = 1 everywhere
    logp = torch.tensor([[0.2, 0.0, 0.1], [0.0, 0.6, 99.0]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(2, 3, dtype=torch.float64)
    adv = torch.ones(2, 3, dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    return old, logp, adv, mask


def test_gspo_hand_computed():
    old, logp, adv, mask = gspo_batch()
    s0 = math.exp(0.1)
    loss, metrics = gspo(old, logp, adv, mask)
    assert loss.item() == pytest.approx((3 * -s0 + 2 * -1.2) / 5)
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 5)
    loss, _ = gspo(old, logp, adv, mask, loss_agg_mode="seq-mean-token-mean")
    assert loss.item() == pytest.approx((-s0 - 1.2) / 2)
    loss.backward()
    # sequence-level gradient: d(-A s_i)/dlogp_t = -A s_i / |y_i|, / 2 seqs; row 1 clipped -> 0
    expected = torch.tensor([[-s0 / 6] * 3, [0.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, expected)


def test_gspo_tiny_clip_range():
    old, logp, adv, mask = gspo_batch()
    _, metrics = gspo(old, logp, adv, mask, clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    assert metrics["pg_clipfrac"].item() == 1.0  # every sequence ratio is outside 1 +- 4e-4


def test_reinforce_hand_computed():
    # -A logp: -(2 * -1) = 2, -(-1 * -3) = -3; pad ignored; token-mean -0.5; grad -A / 2 = (-1, 0.5)
    logp = torch.tensor([[-1.0, -3.0, -9.0]], requires_grad=True)
    adv = torch.tensor([[2.0, -1.0, 4.0]])
    loss, metrics = reinforce(logp.detach(), logp, adv, torch.tensor([[1.0, 1.0, 0.0]]))
    assert loss.item() == pytest.approx(-0.5)
    assert metrics["pg_clipfrac"].item() == 0.0
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, 0.5, 0.0]]))


@pytest.mark.parametrize("name", ["reinforce", "gpg"])
def test_reinforce_and_gpg_hand_computed(name):
    # verl's gpg loss mode is -A logp, REINFORCE's loss: the same numbers and gradient; with IS weights (2, 1) and
    # the old log-probs far off (no ratio is taken): -(2 * -1) * 2 = 4, -(-1 * -3) = -3; token-mean 0.5
    logp = torch.tensor([[-1.0, -3.0, -9.0]], requires_grad=True)
    adv = torch.tensor([[2.0, -1.0, 4.0]])
    weights = torch.tensor([[2.0, 1.0, 1.0]])
    loss, metrics = POLICY_LOSSES.get(name)(
        logp.detach() - 5.0, logp, adv, torch.tensor([[1.0, 1.0, 0.0]]), is_weights=weights
    )
    assert loss.item() == pytest.approx(0.5) and metrics["pg_clipfrac"].item() == 0.0
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-2.0, 0.5, 0.0]]))


def test_value_loss_hand_computed():
    # c = 0.2
    # t0 v 1, old .5 -> vc .7, R 1: max(0, .09) = .09 -> .045   clipped
    # t1 v 2, old .5 -> vc .7, R 0: max(4, .49) = 4 -> 2
    # t2 v 0, old 0 -> vc 0, R 5: 25 both -> 12.5
    values = torch.tensor([[1.0, 2.0, 0.0, 3.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[0.5, 0.5, 0.0, 0.0]], dtype=torch.float64)
    returns = torch.tensor([[1.0, 0.0, 5.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    loss, metrics = value_loss(values, old, returns, mask, cliprange_value=0.2)
    assert loss.item() == pytest.approx((0.045 + 2 + 12.5) / 3)
    assert metrics["vf_clipfrac"].item() == pytest.approx(1 / 3)
    loss.backward()
    # t0 clipped branch, clamp saturated -> 0; t1 (v - R) / 3; t2 (v - R) / 3
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 2 / 3, -5 / 3, 0.0]], dtype=torch.float64))


@pytest.mark.parametrize("name", ["vanilla", "reinforce"])  # gspo's gradient is not its value's, see below
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_policy_losses_gradcheck(name, mode):
    # ratios chosen away from the clip kinks (|log r| <= 0.12 vs log 1.2 = 0.18) or far past them
    old = torch.tensor([[0.0, -0.5, -1.0], [-0.2, -0.1, 0.0]], dtype=torch.float64)
    delta = torch.tensor([[0.05, -0.1, 0.12], [0.5, -0.07, 0.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -0.5, 2.0], [-1.5, 0.7, 3.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    logp = (old + delta).requires_grad_(True)
    fn = POLICY_LOSSES.get(name)
    assert torch.autograd.gradcheck(lambda lp: fn(old, lp, adv, mask, loss_agg_mode=mode)[0], (logp,))


def test_gspo_gradient_is_the_sequence_objective_gradient():
    # GSPO: J = mean_i max(-A_i s_i, -A_i clip(s_i)), s_i = exp(mean_t(logp - old)), A per sequence.
    # The token-wise form with seq-mean-token-mean must give the same gradient (not the same value
    # derivative token by token, hence no gradcheck on gspo itself). Row 2 is clipped.
    old = torch.tensor([[0.0, -0.5, -1.0], [-0.2, -0.1, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    delta = torch.tensor([[0.05, -0.1, 0.12], [0.1, -0.07, 0.0], [0.4, 0.5, 0.6]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.5, 2.0], dtype=torch.float64)[:, None].expand(3, 3)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    logp = (old + delta).requires_grad_(True)
    loss, _ = gspo(old, logp, adv, mask, loss_agg_mode="seq-mean-token-mean")
    (grad,) = torch.autograd.grad(loss, logp)
    seq_ratio = torch.exp(((logp - old) * mask).sum(-1) / mask.sum(-1))
    a = adv[:, 0]
    reference = torch.maximum(-a * seq_ratio, -a * seq_ratio.clamp(0.8, 1.2)).mean()
    (ref_grad,) = torch.autograd.grad(reference, logp)
    torch.testing.assert_close(grad, ref_grad)
    torch.testing.assert_close(loss, reference)
    assert grad[2].abs().sum() == 0


def test_value_loss_gradcheck():
    values = torch.tensor([[0.3, 1.0, -0.4]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[0.25, 0.5, 0.0]], dtype=torch.float64)
    returns = torch.tensor([[1.0, 0.0, 0.1]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda v: value_loss(v, old, returns, mask, 0.2)[0], (values,))


def test_policy_loss_by_name_and_agg_kwargs():
    old, logp, adv, mask = ppo_batch()
    # the same token sum over a global count of 10 tokens: 3.9 / 10
    loss, _ = policy_loss("vanilla", old, logp, adv, mask, agg_kwargs={"global_num_tokens": 10})
    assert loss.item() == pytest.approx(0.39)


def test_vanilla_huge_log_ratio_values_and_gradient():
    # t0 log r = 500 (clamped to 20), A = -1: max(e^20, 1.2) = e^20 -> dual clip min(e^20, 3) = 3
    # t1 log r = -500 (clamped to -20), A = 1: max(-e^-20, -0.8) = -e^-20
    # the clamp and the dual clip both cut the gradient: exactly 0 on both tokens
    old = torch.zeros(1, 2)
    logp = torch.tensor([[500.0, -500.0]], requires_grad=True)
    loss, metrics = vanilla(old, logp, torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2))
    assert loss.item() == pytest.approx((3.0 - math.exp(-20.0)) / 2)
    assert metrics["pg_clipfrac_lower"].item() == 0.5
    loss.backward()
    assert torch.equal(logp.grad, torch.zeros(1, 2))


@pytest.mark.parametrize("garbage", [float("-inf"), float("nan")])
@pytest.mark.parametrize("name", ["vanilla", "gspo", "reinforce"])
def test_padding_garbage_reaches_neither_loss_nor_gradient(name, garbage):
    # Pad tokens may carry -inf / NaN log-probs (old, new) and advantages: same loss, gradient and
    # metrics as with clean padding. (Before the fix: gspo's loss and every ppo_kl were NaN.)
    old, logp, adv, mask = ppo_batch()
    clean_loss, clean_metrics = policy_loss(name, old, logp, adv, mask)
    (clean_grad,) = torch.autograd.grad(clean_loss, logp)
    dirty_old, dirty_adv = old.clone(), adv.clone()
    dirty_old[0, 5], dirty_adv[0, 5] = garbage, garbage
    dirty_logp = torch.cat([logp[:, :5], torch.full((1, 1), garbage, dtype=logp.dtype)], dim=1)
    loss, metrics = policy_loss(name, dirty_old, dirty_logp, dirty_adv, mask)
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(loss, clean_loss)
    torch.testing.assert_close(grad, clean_grad)
    for key, value in clean_metrics.items():
        torch.testing.assert_close(metrics[key], value, msg=key)


def test_low_precision_log_probs_finite_gradient():
    # fp16: exp(15) overflows (max 65504); before the fix the clipped token's gradient was 0 * inf = NaN.
    # t0 r = e^15, A = 1: clipped -> -1.2, gradient 0; t1 r = e^-1: -r, gradient -r / 2
    logp = torch.tensor([[15.0, -1.0]], dtype=torch.float16, requires_grad=True)
    old = torch.zeros(1, 2, dtype=torch.float16)
    adv = torch.ones(1, 2, dtype=torch.float16)
    loss, metrics = vanilla(old, logp, adv, torch.ones(1, 2))
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx((-1.2 - math.exp(-1.0)) / 2, rel=1e-6)
    assert metrics["ppo_kl"].item() == pytest.approx(-7.0)
    loss.backward()
    assert logp.grad[0, 0].item() == 0.0
    assert logp.grad[0, 1].item() == pytest.approx(-math.exp(-1.0) / 2, rel=1e-3)  # fp16 gradient


def test_bf16_matches_float32_of_the_same_values():
    # The same bf16 numbers, computed in bf16 vs upcast: the loss is the float32 one, not a bf16 rounding.
    gen = torch.Generator().manual_seed(0)
    old = (torch.randn(4, 16, generator=gen) * 0.3 - 2.0).bfloat16()
    logp = (old.float() + 0.05 * torch.randn(4, 16, generator=gen)).bfloat16()
    adv = torch.randn(4, 16, generator=gen).bfloat16()
    mask = (torch.arange(16)[None, :] < torch.tensor([[16], [9], [3], [12]])).float()
    for name in ["vanilla", "gspo", "reinforce"]:
        loss, _ = policy_loss(name, old, logp, adv, mask)
        ref, _ = policy_loss(name, old.float(), logp.float(), adv.float(), mask)
        assert loss.dtype == torch.float32
        torch.testing.assert_close(loss, ref, msg=name)
    values = logp.float().requires_grad_(True)
    loss, _ = value_loss(values.bfloat16(), old, adv, mask, 0.2)
    ref, _ = value_loss(values.bfloat16().float(), old.float(), adv.float(), mask, 0.2)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref)


def test_old_log_probs_are_a_constant():
    # On-policy callers may pass old = the same graph as logp; the ratio is 1 but its gradient must
    # still be -A d logp (a constant old), not 0 (both sides differentiated).
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, -2.0]], dtype=torch.float64)
    loss, _ = vanilla(logp, logp, adv, torch.ones(1, 2, dtype=torch.float64))
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(grad, torch.tensor([[-0.5, 1.0]], dtype=torch.float64))


def test_gspo_caps_the_sequence_log_ratio_at_10_from_above_as_verl_does():
    # row 0: logp - old = 15 on both tokens, A = -1: -A e^min(15, 10) = e^10 (not e^15), clamped: no gradient
    # row 1: logp - old = -30, A = +1: no lower cap, max(-e^-30, -0.8) = -e^-30 (unclipped, gradient flows)
    logp = torch.tensor([[15.0, 15.0], [-30.0, -30.0]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(2, 2, dtype=torch.float64)
    adv = torch.tensor([[-1.0, -1.0], [1.0, 1.0]], dtype=torch.float64)
    loss, _ = gspo(old, logp, adv, torch.ones(2, 2, dtype=torch.float64))
    assert loss.item() == pytest.approx((2 * math.exp(10.0) - 2 * math.exp(-30.0)) / 4, rel=1e-12)
    loss.backward()
    assert torch.equal(logp.grad[0], torch.zeros(2, dtype=torch.float64))
    torch.testing.assert_close(logp.grad[1], torch.full((2,), -math.exp(-30.0) / 4, dtype=torch.float64))


def test_value_loss_counts_no_unclipped_token_as_clipped_in_float32():
    # In float32 old + (v - old) is not always v: these values are within the clip range but the sum
    # rounds away from v (checked below), which the old formula counted as clipped.
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(4096, generator=gen)
    # |v - old| < 0.2 < c = 0.5, rounded to float32 from float64 (so v - old is not exact)
    values = (old.double() + (torch.rand(4096, generator=gen).double() - 0.5) * 0.4).float()
    returns = torch.randn(4096, generator=gen)
    assert (old + (values - old) != values).any(), "pick inputs whose round trip loses a bit"
    mask = torch.ones(1, 4096)
    loss, metrics = value_loss(values[None], old[None], returns[None], mask, cliprange_value=0.5)
    assert metrics["vf_clipfrac"].item() == 0.0
    assert loss.item() == pytest.approx((0.5 * (values - returns) ** 2).mean().item(), rel=1e-6)


def test_cispo_hand_computed_every_token_keeps_its_gradient():
    # r = (1.5, 0.9, 0.5), A = (1, -1, 2), clip 0.2: w = sg(clip(r)) = (1.2, 0.9, 0.8), l_t = -w A logp
    ratios = [1.5, 0.9, 0.5]
    logp = torch.tensor([[math.log(r) for r in ratios]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 3, dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, 2.0]], dtype=torch.float64)
    loss, metrics = POLICY_LOSSES.get("cispo")(old, logp, adv, torch.ones(1, 3, dtype=torch.float64))
    expected = (-1.2 * math.log(1.5) + 0.9 * math.log(0.9) - 1.6 * math.log(0.5)) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 3)  # t0 and t2
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.2 / 3, 0.9 / 3, -1.6 / 3]], dtype=torch.float64))


def test_cispo_with_clip_ratio_low_of_one_or_more_has_no_lower_clip():
    # verl's CISPO example sets clip_ratio_low=10: the weight clip(r, -9, 1.2) leaves every r < 1.2 as it is
    ratios = [1.5, 0.9, 0.05]
    logp = torch.tensor([[math.log(r) for r in ratios]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 3, dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, 2.0]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.float64)
    loss, metrics = POLICY_LOSSES.get("cispo")(old, logp, adv, mask, clip_ratio_low=10.0, clip_ratio_high=0.2)
    expected = (-1.2 * math.log(1.5) + 0.9 * math.log(0.9) - 0.1 * math.log(0.05)) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert metrics["pg_clipfrac"].item() == pytest.approx(1 / 3)  # t0 only
    cfg = load_config("grpo", ["actor.policy_loss=cispo", "actor.clip_ratio_low=10"])
    assert cfg.actor.clip_ratio_low == 10
    with pytest.raises(ConfigError, match=r"actor.clip_ratio_low=10.0 must be in \[0, 1\)"):
        load_config("grpo", ["actor.clip_ratio_low=10"])  # PPO's clip(r, 1 - low, ...) needs low < 1


def test_geo_mean_hand_computed():
    # row 0, A = +1, d = (0.3, -0.1, 0.05): clipped pessimistically to (0.2, -0.1, 0.05), mean 0.05
    # row 1, A = -1, d = (-0.5, 0.1, pad): clipped to (-0.2, 0.1), mean -0.05
    # loss = mean over sequences of -A_i exp(mean): (-e^0.05 + e^-0.05) / 2
    logp = torch.tensor([[0.3, -0.1, 0.05], [-0.5, 0.1, 7.0]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(2, 3, dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    loss, metrics = POLICY_LOSSES.get("geo_mean")(old, logp, adv, mask, loss_agg_mode="token-mean")
    assert loss.item() == pytest.approx((-math.exp(0.05) + math.exp(-0.05)) / 2, rel=1e-12)
    assert metrics["pg_clipfrac"].item() == pytest.approx(1 / 5)  # row 0 t0 (A > 0)
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(1 / 5)  # row 1 t0 (A < 0)
    loss.backward()
    # the clipped tokens get no gradient; the others d/dlogp_t = -A_i exp(mean_i) / n_i / 2 sequences
    e0, e1 = math.exp(0.05) / 6, math.exp(-0.05) / 4
    expected = torch.tensor([[0.0, -e0, -e0], [0.0, e1, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, expected)


def test_sapo_gate_is_the_policy_gradient_on_policy_and_soft_away_from_it():
    # t0: r = 1, A = +1, tau 1: gate 4 sigma(0) = 2, l = -2; d l / d logp = -A (4/tau) tau sigma'(0) r = -1
    # t1: r = e^0.5, A = -1, tau 1.05: gate (4 / 1.05) sigma(1.05 (e^0.5 - 1)), l = +gate
    logp = torch.tensor([[0.0, 0.5]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 2, dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    loss, metrics = POLICY_LOSSES.get("sapo")(old, logp, adv, torch.ones(1, 2, dtype=torch.float64))

    def sigmoid(x):
        return 1 / (1 + math.exp(-x))

    r1 = math.exp(0.5)
    gate1 = 4 / 1.05 * sigmoid(1.05 * (r1 - 1))
    assert loss.item() == pytest.approx((-2 + gate1) / 2, rel=1e-12)  # seq-mean-token-mean, one sequence
    loss.backward()
    d_gate1 = 4 * sigmoid(1.05 * (r1 - 1)) * (1 - sigmoid(1.05 * (r1 - 1))) * r1
    torch.testing.assert_close(logp.grad, torch.tensor([[-1 / 2, d_gate1 / 2]], dtype=torch.float64))
    assert metrics["pg_clipfrac"].item() == 0.0
    with pytest.raises(ValueError, match="tau_pos and tau_neg must be > 0"):
        POLICY_LOSSES.get("sapo")(old, logp, adv, torch.ones(1, 2), tau_neg=0.0)
