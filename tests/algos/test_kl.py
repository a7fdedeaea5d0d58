"""KL estimators (values, clamps, straight-through gradients), controllers, KL in the reward."""

import math

import pytest
import torch

from tandem.algos import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_loss,
    kl_penalty,
    make_kl_controller,
)

# d = logp - ref = (0.5, -1.0)
LOGP = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
REF = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("kl", [0.5, -1.0]),
        ("k1", [0.5, -1.0]),
        ("abs", [0.5, 1.0]),
        ("mse", [0.125, 0.5]),  # 0.5 d^2
        ("k2", [0.125, 0.5]),
        # x = ref - logp = (-0.5, 1): e^x - x - 1 = e^-0.5 - 0.5, e - 2
        ("low_var_kl", [math.exp(-0.5) - 0.5, math.e - 2]),
        ("k3", [math.exp(-0.5) - 0.5, math.e - 2]),
    ],
)
def test_estimators_hand_computed(kind, expected):
    out = kl_penalty(LOGP, REF, kind)
    torch.testing.assert_close(out, torch.tensor([expected], dtype=torch.float64))


def test_low_var_kl_clamped_and_zero_gradient():
    # x = -30 -> k3 = e^-30 + 29 > 10; x = 30 -> e^30 - 31 > 10: both clamp to 10, no overflow;
    # clamped values carry no gradient
    logp = torch.tensor([[0.0, -30.0]], requires_grad=True)
    ref = torch.tensor([[-30.0, 0.0]])
    out = kl_penalty(logp, ref, "low_var_kl")
    assert out.tolist() == [[10.0, 10.0]]
    out.sum().backward()
    assert torch.equal(logp.grad, torch.zeros(1, 2))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_estimators_float32_and_finite(dtype):
    # fp16: exp(12) = 162755 overflows (max 65504); before the fix k3's gradient was 0 * inf = NaN.
    logp = torch.tensor([[0.0, -1.0]], dtype=dtype, requires_grad=True)
    ref = torch.tensor([[12.0, -0.5]], dtype=dtype)
    out = kl_penalty(logp, ref, "low_var_kl")
    assert out.dtype == torch.float32
    # x = ref - logp = (12, 0.5): k3 = (clamped 10, e^0.5 - 1.5); gradient (0, 1 - e^0.5)
    torch.testing.assert_close(out, torch.tensor([[10.0, math.exp(0.5) - 1.5]]))
    out.sum().backward()
    torch.testing.assert_close(
        logp.grad.float(), torch.tensor([[0.0, 1 - math.exp(0.5)]]), atol=1e-2, rtol=1e-2
    )
    assert logp.grad[0, 0].item() == 0.0


def test_verl_style_plus_aliases():
    for short, long in (("k1+", "kl+"), ("k2+", "mse+"), ("k3+", "low_var_kl+")):
        assert short in KL_ESTIMATORS
        torch.testing.assert_close(kl_penalty(LOGP, REF, short), kl_penalty(LOGP, REF, long))


# logp (-1, -2, pad -inf), ref (-1.5, -1, pad -inf): x = ref - logp = (-0.5, 1)
KL_LOGP = [[-1.0, -2.0, float("-inf")]]
KL_REF = torch.tensor([[-1.5, -1.0, float("-inf")]], dtype=torch.float64)
KL_MASK = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)


def test_kl_loss_hand_computed_value_and_gradient():
    logp = torch.tensor(KL_LOGP, dtype=torch.float64, requires_grad=True)
    loss = kl_loss(logp, KL_REF, KL_MASK)  # low_var_kl, token-mean
    assert loss.item() == pytest.approx((math.exp(-0.5) - 0.5 + math.e - 2) / 2)
    loss.backward()
    # d/dlogp (e^x - x - 1) = 1 - e^x, / 2 tokens; padding: 0, not NaN
    expected = torch.tensor([[(1 - math.exp(-0.5)) / 2, (1 - math.e) / 2, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, expected)


def test_kl_loss_straight_through_and_global_counts():
    logp = torch.tensor(KL_LOGP, dtype=torch.float64, requires_grad=True)
    # seq-mean-token-sum over 4 global sequences: (k3_0 + k3_1) / 4; gradient k2's: (logp - ref) / 4
    loss = kl_loss(logp, KL_REF, KL_MASK, "k3+", "seq-mean-token-sum", {"global_num_seqs": 4})
    assert loss.item() == pytest.approx((math.exp(-0.5) - 0.5 + math.e - 2) / 4)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.125, -0.25, 0.0]], dtype=torch.float64))


def test_kl_loss_reference_gets_no_gradient():
    logp = torch.tensor(KL_LOGP, dtype=torch.float64, requires_grad=True)
    ref = KL_REF.clone().requires_grad_(True)
    kl_loss(logp, ref, KL_MASK, "kl").backward()
    assert ref.grad is None
    torch.testing.assert_close(logp.grad, torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64))


@pytest.mark.parametrize("kind", ["kl", "abs", "mse", "low_var_kl"])
def test_straight_through_value_and_gradient(kind):
    logp = LOGP.clone().requires_grad_(True)
    plus = kl_penalty(logp, REF, f"{kind}+")
    assert torch.equal(plus, kl_penalty(LOGP, REF, kind))  # forward is exactly the named estimator
    plus.sum().backward()
    torch.testing.assert_close(logp.grad, LOGP - REF)  # d/dlogp of 0.5 (logp - ref)^2


def test_fixed_controller():
    ctrl = make_kl_controller("fixed", kl_coef=0.05)
    ctrl.update(100.0, n_steps=64)
    assert ctrl.value == 0.05
    other = FixedKLController(0.0)
    other.load_state_dict(ctrl.state_dict())
    assert other.value == 0.05


def test_adaptive_controller_two_steps():
    ctrl = make_kl_controller("adaptive", init_kl_coef=0.1, target_kl=6.0, horizon=10000)
    # step 1: KL 9 -> 9/6 - 1 = 0.5 clipped to 0.2; beta = 0.1 * (1 + 0.2 * 256 / 10000) = 0.100512
    ctrl.update(9.0, n_steps=256)
    assert ctrl.value == pytest.approx(0.100512, rel=1e-12)
    # step 2: KL 5.4 -> -0.1 (inside the clip); beta = 0.100512 * (1 - 0.1 * 128 / 10000) = 0.100383344...
    ctrl.update(5.4, n_steps=128)
    assert ctrl.value == pytest.approx(0.100512 * 0.99872, rel=1e-12)
    resumed = AdaptiveKLController(0.1, 6.0, 10000)
    resumed.load_state_dict(ctrl.state_dict())
    assert resumed.value == ctrl.value


def test_controller_errors():
    with pytest.raises(ValueError, match="target_kl"):
        AdaptiveKLController(0.1, 0.0, 100)
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(0.1, 1.0, 0)
    with pytest.raises(KeyError, match="Did you mean 'adaptive'"):
        make_kl_controller("adaptiv", init_kl_coef=0.1)


def test_apply_kl_penalty_hand_computed():
    # k1 with ref = 0: KL = logp; row 1's last token is padding (50 ignored)
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    logp = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.6, 50.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    ctrl = FixedKLController(0.5)
    rewards, metrics = apply_kl_penalty(scores, logp, torch.zeros_like(logp), mask, ctrl, kind="kl")
    # r = s - 0.5 KL
    expected = torch.tensor([[-0.05, -0.1, 0.85], [-0.2, 1.7, 0.0]])
    torch.testing.assert_close(rewards, expected)
    # per-seq token means 0.2 and 0.5 -> KL 0.35
    assert metrics["kl"] == pytest.approx(0.35)
    assert metrics["kl_coef"] == 0.5


def test_apply_kl_penalty_updates_adaptive_controller():
    # one sequence, KL 0.3 vs target 0.1: error clipped to 0.2; n_steps = batch size 2
    scores = torch.zeros(2, 1)
    logp = torch.tensor([[0.3], [0.0]])
    mask = torch.tensor([[1.0], [0.0]])  # row 1 has no valid token: not in the KL mean
    ctrl = AdaptiveKLController(0.2, target_kl=0.1, horizon=10)
    _, metrics = apply_kl_penalty(scores, logp, torch.zeros_like(logp), mask, ctrl)
    assert metrics["kl"] == pytest.approx(0.3) and metrics["kl_coef"] == 0.2
    assert ctrl.value == pytest.approx(0.2 * (1 + 0.2 * 2 / 10))


def test_controller_from_config_sections():
    from tandem.algos import AdaptiveKLController, FixedKLController, kl_controller_from_config
    from tandem.config import load_config

    fixed = kl_controller_from_config(
        load_config("ppo", ["algorithm.kl_ctrl.kl_coef=0.05"]).algorithm.kl_ctrl
    )
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.05
    cfg = load_config(
        "ppo",
        [
            "algorithm.kl_ctrl.type=adaptive",
            "algorithm.kl_ctrl.kl_coef=0.2",
            "algorithm.kl_ctrl.target_kl=0.1",
            "algorithm.kl_ctrl.horizon=100",
        ],
    )
    adaptive = kl_controller_from_config(cfg.algorithm.kl_ctrl)
    assert isinstance(adaptive, AdaptiveKLController)
    # KL 0.2 vs target 0.1: error clipped to 0.2; beta = 0.2 * (1 + 0.2 * 10 / 100) = 0.204
    adaptive.update(0.2, n_steps=10)
    assert adaptive.value == pytest.approx(0.204)
