"""Masked and group statistics, log-probs and entropy from logits, registry lookups."""

import math

import numpy as np
import pytest
import torch

import tandem.algos as algos
from tandem.algos import (
    ADV_ESTIMATORS,
    AGG_MODES,
    IS_LEVELS,
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    entropy_from_logits,
    group_ids,
    group_stats,
    log_probs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
M = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def test_masked_sum_and_mean():
    # valid: 1, 2, 4 -> sum 7, mean 7/3; per row: (1+2)/2 = 1.5, 4/1 = 4
    assert masked_sum(X, M).item() == pytest.approx(7.0)
    assert masked_mean(X, M).item() == pytest.approx(7 / 3)
    torch.testing.assert_close(masked_mean(X, M, dim=-1), torch.tensor([1.5, 4.0]))
    torch.testing.assert_close(masked_mean(X, M.bool(), dim=-1), torch.tensor([1.5, 4.0]))


def test_masked_mean_of_nothing_is_zero():
    assert masked_mean(X, torch.zeros_like(M)).item() == 0.0
    torch.testing.assert_close(masked_mean(X, torch.zeros_like(M), dim=-1), torch.zeros(2))


def test_masked_var_and_whiten():
    # valid 1, 2, 4: mean 7/3, squared deviations (16 + 1 + 25) / 9 = 42/9; unbiased /2 = 7/3, biased /3
    assert masked_var(X, M).item() == pytest.approx(7 / 3)
    assert masked_var(X, M, unbiased=False).item() == pytest.approx(14 / 9)
    white = masked_whiten(X, M, eps=0.0)
    expected = (X - 7 / 3) / math.sqrt(7 / 3) * M
    torch.testing.assert_close(white, expected)
    assert white[0, 2].item() == 0.0 and white[1, 1].item() == 0.0


def test_whiten_single_token_and_constant_is_zero_not_nan():
    one = torch.tensor([[5.0, 9.0]])
    assert torch.equal(masked_whiten(one, torch.tensor([[1.0, 0.0]])), torch.zeros(1, 2))
    assert torch.equal(masked_whiten(torch.full((2, 2), 3.0), torch.ones(2, 2)), torch.zeros(2, 2))


@pytest.mark.parametrize("garbage", [float("inf"), float("nan")])
def test_masked_stats_ignore_garbage_at_padding(garbage):
    dirty = torch.where(M > 0, X, torch.tensor(garbage))
    assert masked_sum(dirty, M).item() == pytest.approx(7.0)
    torch.testing.assert_close(masked_mean(dirty, M, dim=-1), torch.tensor([1.5, 4.0]))
    assert masked_var(dirty, M).item() == pytest.approx(7 / 3)
    torch.testing.assert_close(masked_whiten(dirty, M, eps=0.0), (X - 7 / 3) / math.sqrt(7 / 3) * M)


def test_group_stats_noncontiguous_string_ids():
    # a: 1, 3, 5 -> mean 3, unbiased std sqrt((4 + 0 + 4) / 2) = 2; b: 2 alone; c: 10 alone
    scores = torch.tensor([1.0, 2.0, 3.0, 10.0, 5.0])
    mean, std, count = group_stats(scores, ["a", "b", "a", "c", "a"])
    torch.testing.assert_close(mean, torch.tensor([3.0, 2.0, 3.0, 10.0, 3.0]))
    torch.testing.assert_close(std, torch.tensor([2.0, 0.0, 2.0, 0.0, 2.0]))
    torch.testing.assert_close(count, torch.tensor([3.0, 1.0, 3.0, 1.0, 3.0]))


def test_group_stats_equal_scores_exact():
    # 0.1 + 0.1 + 0.1 != 0.3 in floating point; the min-shift makes mean and std exact.
    scores = torch.tensor([0.1, 0.1, 0.1], dtype=torch.float64)
    mean, std, _ = group_stats(scores, np.array([7, 7, 7]))
    assert torch.equal(mean, scores) and torch.equal(std, torch.zeros(3, dtype=torch.float64))


def test_group_ids_accepts_tensor_and_checks_length():
    inverse, n = group_ids(torch.tensor([5, 3, 5]), 3)
    assert n == 2 and inverse.tolist() == [1, 0, 1]
    with pytest.raises(ValueError, match="one group id per sample"):
        group_ids(["a", "b"], 3)


def test_log_probs_from_logits_matches_manual():
    # log softmax([1, 2, 3])[2] = 3 - log(e + e^2 + e^3)
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    expected = 3 - math.log(math.e + math.e**2 + math.e**3)
    assert log_probs_from_logits(logits, torch.tensor([2])).item() == pytest.approx(expected, abs=1e-6)
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 11, dtype=torch.float64)
    labels = torch.randint(0, 11, (2, 4))
    manual = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    torch.testing.assert_close(log_probs_from_logits(logits, labels), manual)


def test_log_probs_low_precision_chunks():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 13).bfloat16()
    labels = torch.randint(0, 13, (3, 5))
    manual = torch.log_softmax(logits.float(), -1).gather(-1, labels[..., None]).squeeze(-1)
    out = log_probs_from_logits(logits, labels, chunk_rows=4)  # 15 rows -> 4 chunks
    assert out.dtype == torch.float32 and out.shape == (3, 5)
    torch.testing.assert_close(out, manual)


def test_entropy_huge_logits_finite_and_stable():
    # two logits at 1e4 and one at 0: p = (1/2, 1/2, ~0) -> H = log 2
    logits = torch.tensor([[1e4, 1e4, 0.0], [1e4, 1e4 - 1.0, -1e4]], requires_grad=True)
    h = entropy_from_logits(logits)
    ref64 = logits.detach().double()
    p = torch.softmax(ref64, -1)
    reference = -(torch.special.xlogy(p, p)).sum(-1)
    assert torch.isfinite(h).all()
    assert h[0].item() == pytest.approx(math.log(2), abs=1e-6)
    torch.testing.assert_close(h.double(), reference, atol=1e-6, rtol=1e-6)
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_entropy_with_masked_vocabulary():
    # -inf logits (a masked vocabulary entry) have p = 0 and add nothing: H([1, 0, -inf]) = H([1, 0]).
    # Before the fix: p * z = 0 * -inf = NaN in value and gradient.
    logits = torch.tensor([[1.0, 0.0, float("-inf")]], dtype=torch.float64, requires_grad=True)
    two = torch.tensor([[1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    h, h_two = entropy_from_logits(logits), entropy_from_logits(two)
    p = 1 / (1 + math.exp(-1.0))
    assert h.item() == pytest.approx(-(p * math.log(p) + (1 - p) * math.log(1 - p)))
    torch.testing.assert_close(h, h_two)
    h.backward()
    h_two.backward()
    torch.testing.assert_close(logits.grad[:, :2], two.grad)
    assert logits.grad[0, 2].item() == 0.0
    bf16 = entropy_from_logits(logits.detach().bfloat16())
    assert bf16.item() == pytest.approx(h.item(), rel=1e-6)


def test_entropy_uniform_and_bf16():
    assert entropy_from_logits(torch.zeros(2, 8)).tolist() == pytest.approx([math.log(8)] * 2)
    torch.manual_seed(0)
    logits = torch.randn(4, 6, 9)
    torch.testing.assert_close(
        entropy_from_logits(logits.bfloat16(), chunk_rows=5),
        entropy_from_logits(logits.bfloat16().float()),
    )


def test_registries_filled_and_lookup_by_name():
    assert algos.grpo is ADV_ESTIMATORS.get("grpo")
    assert POLICY_LOSSES.get("vanilla") is algos.vanilla
    assert set(AGG_MODES.names()) == {
        "token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
    }
    assert {"kl", "abs", "mse", "low_var_kl", "kl+", "k3"} <= set(KL_ESTIMATORS.names())
    assert set(KL_CONTROLLERS.names()) == {"fixed", "adaptive"}
    assert set(IS_LEVELS.names()) == {"token", "sequence"}


def test_unknown_name_suggests_close_one():
    with pytest.raises(KeyError, match="Did you mean 'grpo'"):
        ADV_ESTIMATORS.get("grpoo")
    with pytest.raises(KeyError, match="Did you mean 'low_var_kl'"):
        KL_ESTIMATORS.get("low_var_k")
