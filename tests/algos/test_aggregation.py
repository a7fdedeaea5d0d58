"""Loss aggregation modes and the micro-batch / data-parallel contribution contract."""

import pytest
import torch

from tandem.algos import AGG_MODES, agg_loss, global_counts

MODES = sorted(AGG_MODES)

# row 0: tokens 1, 2 valid; row 1: token 4 valid; row 2: all padding (7, 8, 9 ignored)
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


def test_global_counts():
    # 3 valid tokens; 2 rows with a valid token (the all-padding row does not count)
    assert global_counts(MASK) == {"global_num_tokens": 3, "global_num_seqs": 2}
    assert global_counts(MASK.bool()) == {"global_num_tokens": 3, "global_num_seqs": 2}


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-sum", 3.5),  # (3 + 4) / 2 seqs
        ("seq-mean-token-mean", 2.75),  # (1.5 + 4) / 2 seqs
        ("seq-mean-token-sum-norm", 7 / 6),  # (3 + 4) / (2 seqs * 3 max length)
    ],
)
def test_modes_hand_computed(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7 / 10),  # global count 10 tokens
        ("seq-mean-token-sum", 7 / 4),  # 4 global seqs
        ("seq-mean-token-mean", 5.5 / 4),
        ("seq-mean-token-sum-norm", 7 / (4 * 8)),  # norm_length 8
    ],
)
def test_global_counts_override_local(mode, expected):
    out = agg_loss(LOSS, MASK, mode, global_num_tokens=10, global_num_seqs=torch.tensor(4), norm_length=8)
    assert out.item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", MODES)
def test_all_padding_is_zero_not_nan(mode):
    out = agg_loss(LOSS, torch.zeros_like(MASK), mode)
    assert out.item() == 0.0


@pytest.mark.parametrize("mode", MODES)
def test_contributions_sum_to_global_loss(mode):
    # 6 sequences of lengths 5, 1, 3, 0, 4, 2; per-token loss a leaf so that gradients compare
    lengths = torch.tensor([5, 1, 3, 0, 4, 2])
    mask = (torch.arange(5)[None, :] < lengths[:, None]).double()
    loss_mat = torch.linspace(-1.0, 2.0, 30, dtype=torch.float64).reshape(6, 5).requires_grad_(True)
    full = agg_loss(loss_mat, mask, mode)
    (full_grad,) = torch.autograd.grad(full, loss_mat)

    counts = global_counts(mask)
    splits = {
        "micro-batches of 2": [slice(0, 2), slice(2, 4), slice(4, 6)],
        # rank 0 holds rows 0-2, rank 1 rows 3-5, each split unevenly into micro-batches of 2 and 1
        "2 ranks": [slice(0, 2), slice(2, 3), slice(3, 5), slice(5, 6)],
    }
    for name, slices in splits.items():
        total = sum(agg_loss(loss_mat[s], mask[s], mode, **counts, norm_length=5) for s in slices)
        (grad,) = torch.autograd.grad(total, loss_mat)
        torch.testing.assert_close(total, full, msg=f"{mode}, {name}")
        torch.testing.assert_close(grad, full_grad, msg=f"{mode}, {name}")


def test_shape_mismatch_and_unknown_mode():
    with pytest.raises(ValueError, match="differ in shape"):
        agg_loss(LOSS, MASK[:, :2])
    with pytest.raises(KeyError, match="Did you mean 'token-mean'"):
        agg_loss(LOSS, MASK, "token_mean")
    with pytest.raises(ValueError, match="norm_length"):
        agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=0)


@pytest.mark.parametrize("garbage", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("mode", MODES)
def test_garbage_at_padding_ignored_in_value_and_gradient(mode, garbage):
    # before the fix: loss * mask made inf * 0 = NaN
    clean = LOSS.clone().requires_grad_(True)
    expected = agg_loss(clean, MASK, mode)
    expected.backward()
    dirty = torch.where(MASK > 0, LOSS, torch.tensor(garbage)).requires_grad_(True)
    out = agg_loss(dirty, MASK, mode)
    out.backward()
    assert out.item() == pytest.approx(expected.item())
    torch.testing.assert_close(dirty.grad, clean.grad)


def test_low_precision_sum_does_not_overflow():
    # two sequences of 40000 tokens of loss 1 in fp16: a fp16 sum is 80000 > 65504 = inf
    loss = torch.ones(2, 40000, dtype=torch.float16)
    mask = torch.ones(2, 40000)
    out = agg_loss(loss, mask, "seq-mean-token-sum")
    assert out.dtype == torch.float32 and out.item() == 40000.0
    assert agg_loss(loss.bfloat16(), mask, "token-mean").item() == 1.0
