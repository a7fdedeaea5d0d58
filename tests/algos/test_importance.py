"""Truncated importance-sampling weights and trainer-vs-rollout mismatch metrics."""

import math

import pytest
import torch

from tandem.algos import is_weights, mismatch_metrics

# log-ratios old - rollout: row 0 (0.5, -0.5, 2.0); row 1 (0.1, padding 1000, padding -inf)
OLD = torch.tensor([[0.5, -0.5, 2.0], [0.1, 1000.0, float("-inf")]], requires_grad=True)
ROLLOUT = torch.zeros(2, 3)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


def test_token_weights_hand_computed():
    # min(e^0.5, 2) = e^0.5; e^-0.5; min(e^2, 2) = 2; e^0.1; padding 0
    w = is_weights(OLD, ROLLOUT, MASK, level="token", threshold=2.0)
    expected = torch.tensor([[math.exp(0.5), math.exp(-0.5), 2.0], [math.exp(0.1), 0.0, 0.0]])
    torch.testing.assert_close(w, expected)
    assert not w.requires_grad


def test_sequence_weights_hand_computed():
    # row 0: sum 0.5 - 0.5 + 2 = 2 -> min(e^2, 2) = 2 on each token; row 1: e^0.1 on its one token
    w = is_weights(OLD, ROLLOUT, MASK, level="sequence", threshold=2.0)
    expected = torch.tensor([[2.0, 2.0, 2.0], [math.exp(0.1), 0.0, 0.0]])
    torch.testing.assert_close(w, expected)


def test_sequence_weights_no_overflow():
    # a sum of log-ratios of 5000 would overflow exp(); -5000 underflows to 0
    old = torch.tensor([[500.0] * 10, [-500.0] * 10])
    w = is_weights(old, torch.zeros(2, 10), torch.ones(2, 10), level="sequence", threshold=3.0)
    assert torch.equal(w[0], torch.full((10,), 3.0)) and torch.equal(w[1], torch.zeros(10))


def test_bad_level_and_threshold():
    with pytest.raises(KeyError, match="Did you mean 'token'"):
        is_weights(OLD, ROLLOUT, MASK, level="tokens")
    with pytest.raises(ValueError, match="threshold"):
        is_weights(OLD, ROLLOUT, MASK, threshold=0.0)


def test_mismatch_metrics_hand_computed():
    # log r = old - rollout = (0.5, 0); padding token ignored
    old = torch.tensor([[-1.0, -2.0, 0.0]])
    rollout = torch.tensor([[-1.5, -2.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    m = mismatch_metrics(old, rollout, mask, threshold=1.5)
    assert m["mismatch_kl"] == pytest.approx(-0.25)  # mean(rollout - old) = (-0.5 + 0) / 2
    assert m["mismatch_k3"] == pytest.approx((math.exp(0.5) - 1.5) / 2)  # mean(r - 1 - log r)
    assert m["mismatch_max_ratio"] == pytest.approx(math.exp(0.5))
    assert m["mismatch_min_ratio"] == pytest.approx(1.0)
    assert m["mismatch_abs_diff_mean"] == pytest.approx((math.exp(-1.0) - math.exp(-1.5)) / 2)
    assert m["mismatch_frac_above_threshold"] == pytest.approx(0.5)  # e^0.5 = 1.65 > 1.5
    assert all(isinstance(v, float) for v in m.values())


def test_mismatch_metrics_all_padding():
    m = mismatch_metrics(OLD.detach(), ROLLOUT, torch.zeros(2, 3), threshold=2.0)
    assert all(isinstance(v, float) and math.isfinite(v) for v in m.values())
    assert m["mismatch_max_ratio"] == 1.0 and m["mismatch_kl"] == 0.0


def test_low_precision_log_probs_computed_in_float32():
    # bf16 log-probs: the weights are those of the same numbers in float64 (before the fix the
    # differences and the sequence sum were taken in bf16: a few % off after exp()).
    gen = torch.Generator().manual_seed(0)
    old = (torch.randn(3, 64, generator=gen) - 3.0).bfloat16()
    rollout = (old.float() + 0.02 * torch.randn(3, 64, generator=gen)).bfloat16()
    mask = (torch.arange(64)[None, :] < torch.tensor([[64], [40], [7]])).float()
    for level in ("token", "sequence"):
        w = is_weights(old, rollout, mask, level=level, threshold=100.0)
        ref = is_weights(old.double(), rollout.double(), mask, level=level, threshold=100.0)
        assert w.dtype == torch.float32
        torch.testing.assert_close(w, ref.float(), msg=level)
