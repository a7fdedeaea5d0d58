"""Rollout correction (verl's algorithm.rollout_correction): IcePop band, batch normalisation,
rejection sampling and the diagnostics, against hand-computed values."""

import math

import pytest
import torch

from tandem.algo_options import parse_rollout_is_threshold, parse_rollout_rs, ratio_bounds
from tandem.algos import (
    ROLLOUT_RS,
    batch_normalize,
    effective_sample_size,
    offpolicy_metrics,
    rejection_masks,
    rollout_correction,
    rollout_is_weights,
)
from tandem.algos.rollout_correction import is_metrics, rs_metrics

# log r = old - rollout: row 0 (0.5, -0.5, 2.0); row 1 (0.1, then padding holding 1000 / -inf / NaN)
OLD = torch.tensor([[0.5, -0.5, 2.0], [0.1, 1000.0, float("-inf")]])
ROLLOUT = torch.tensor([[0.0, 0.0, 0.0], [0.0, float("nan"), 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
E = math.exp


def test_icepop_band_zeroes_token_weights_outside_it():
    # r = e^0.5 = 1.65 kept; e^-0.5 = 0.61 < 0.7 -> 0; e^2 = 7.39 > 5 -> 0 (not clipped to 5); e^0.1 kept
    w = rollout_is_weights(OLD, ROLLOUT, MASK, "token", threshold=2.0, band=(0.7, 5.0))
    torch.testing.assert_close(w, torch.tensor([[E(0.5), 0.0, 0.0], [E(0.1), 0.0, 0.0]]))
    # inside the band the threshold still truncates: band (0.5, 10) keeps e^2 as min(e^2, 2) = 2
    w = rollout_is_weights(OLD, ROLLOUT, MASK, "token", threshold=2.0, band=(0.5, 10.0))
    torch.testing.assert_close(w, torch.tensor([[E(0.5), E(-0.5), 2.0], [E(0.1), 0.0, 0.0]]))


def test_icepop_band_at_sequence_level_drops_whole_sequences():
    # row 0: prod r = e^2 = 7.39 > 3 -> every token 0; row 1: e^0.1 inside
    w = rollout_is_weights(OLD, ROLLOUT, MASK, "sequence", threshold=2.0, band=(0.5, 3.0))
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 0.0], [E(0.1), 0.0, 0.0]]))


def test_verls_lower_upper_threshold_is_the_band_truncated_at_upper():
    assert parse_rollout_is_threshold(2.0) == (2.0, None)
    assert parse_rollout_is_threshold("3") == (3.0, None)  # a float-like string, as verl allows
    threshold, band = parse_rollout_is_threshold("0.5_2.0")
    assert (threshold, band) == (2.0, (0.5, 2.0))
    # verl zeroes r outside [0.5, 2] and leaves the rest: e^0.5, e^-0.5 and e^0.1 kept, e^2 = 7.39 -> 0
    w = rollout_is_weights(OLD, ROLLOUT, MASK, "token", threshold=threshold, band=band)
    torch.testing.assert_close(w, torch.tensor([[E(0.5), E(-0.5), 0.0], [E(0.1), 0.0, 0.0]]))


@pytest.mark.parametrize(
    ("threshold", "match"),
    [
        ("2_0.5", "rollout_is_threshold='2_0.5': expected a number > 0"),
        ("abc", "rollout_is_threshold='abc': expected .* or lower_upper"),
        ("0.5_", "rollout_is_threshold='0.5_': expected"),
        ("0.5_1_2", "rollout_is_threshold='0.5_1_2': expected"),
        ("1.2_3.0", "needs lower <= 1 <= upper"),
        (0.0, "algorithm.rollout_correction.rollout_is_threshold=0.0 must be > 0"),
    ],
)
def test_bad_rollout_is_threshold_names_the_key_the_value_and_the_forms(threshold, match):
    with pytest.raises(ValueError, match=match):
        parse_rollout_is_threshold(threshold)


def test_ratio_bounds_shared_by_rollout_is_and_k1_thresholds():
    assert ratio_bounds("0.5_2.0") == (0.5, 2.0) and ratio_bounds("4") == (0.25, 4.0)
    for bad in ("2_0.5", "0.5_", "1_1", "0_2", "0.5_inf", "x_2", "0.5"):  # 0.5: 1/u > u
        assert ratio_bounds(bad) is None
    assert parse_rollout_rs("token_k1", "0.5_2.0") == [("token_k1", 0.5, 2.0)]


def test_batch_normalize_token_and_sequence():
    w = rollout_is_weights(OLD, ROLLOUT, MASK, "token", threshold=2.0)  # 1.65, 0.61, 2, 1.11
    mean = (E(0.5) + E(-0.5) + 2.0 + E(0.1)) / 4
    out = batch_normalize(w, MASK, "token")
    torch.testing.assert_close(out, w / mean)
    assert float(out[MASK.bool()].mean()) == pytest.approx(1.0)
    # sequence level: one weight per sequence, 2 and e^0.1, whatever the lengths (3 and 1 tokens)
    w = rollout_is_weights(OLD, ROLLOUT, MASK, "sequence", threshold=2.0)
    torch.testing.assert_close(batch_normalize(w, MASK, "sequence"), w / ((2.0 + E(0.1)) / 2))
    # all weights 0 (e.g. a band dropped everything): left as they are, no division by 0
    zeros = torch.zeros(2, 3)
    assert torch.equal(batch_normalize(zeros, MASK, "token"), zeros)


def test_rejection_token_options():
    # token_k1 bounds pi_rollout / pi_old = 1 / r (verl's k1 = -log r): 0.7_1.7 keeps r in [0.588, 1.43]
    keep = rejection_masks(OLD, ROLLOUT, MASK, "token_k1", "0.7_1.7")
    assert keep["all"].tolist() == [[False, True, False], [True, False, False]]
    # one number u means 1/u .. u: r in [0.5, 2]
    assert rejection_masks(OLD, ROLLOUT, MASK, "token_k1", 2.0)["all"][0].tolist() == [True, True, False]
    # k2 = (log r)^2 / 2 = 0.125, 0.125, 2, 0.005 <= 0.2
    assert rejection_masks(OLD, ROLLOUT, MASK, "token_k2", 0.2)["all"][0].tolist() == [True, True, False]
    # k3 = r - 1 - log r = 0.149, 0.107, 4.39: 0.12 keeps only the middle one
    assert rejection_masks(OLD, ROLLOUT, MASK, "token_k3", 0.12)["all"][0].tolist() == [False, True, False]


@pytest.mark.parametrize(
    ("option", "threshold", "row0_kept"),
    [
        ("seq_sum_k1", "0.5_2.0", False),  # sum(-log r) = -2 < log 0.5
        ("seq_mean_k1", "0.5_2.0", True),  # mean = -2/3 >= log 0.5 = -0.69 (geometric mean of 1/r)
        ("seq_mean_k1", "0.6_2.0", False),  # log 0.6 = -0.51
        ("seq_sum_k2", 2.3, True),  # 0.125 + 0.125 + 2 = 2.25
        ("seq_mean_k2", 0.7, False),  # 2.25 / 3 = 0.75
        ("seq_mean_k3", 1.6, True),  # (0.149 + 0.107 + 4.389) / 3 = 1.548
        ("seq_sum_k3", 4.6, False),  # 4.645
        ("seq_max_k2", 1.0, False),  # max 2.0
        ("seq_max_k3", 4.4, True),  # max 4.389
    ],
)
def test_rejection_sequence_options(option, threshold, row0_kept):
    keep = rejection_masks(OLD, ROLLOUT, MASK, option, threshold)["all"]
    assert keep[0].tolist() == [row0_kept] * 3
    assert keep[1].tolist() == [True, False, False]  # row 1 (log r = 0.1) passes all; padding never kept


def test_several_options_all_must_pass_and_their_metrics():
    keep = rejection_masks(OLD, ROLLOUT, MASK, "token_k2, seq_sum_k1", "0.2,0.5_2.0")
    assert keep["token_k2"][0].tolist() == [True, True, False]
    assert keep["seq_sum_k1"][0].tolist() == [False, False, False]
    assert keep["all"].tolist() == [[False, False, False], [True, False, False]]
    m = rs_metrics(MASK, keep)
    assert m["rollout_rs_masked_fraction"] == pytest.approx(3 / 4)  # of 4 valid tokens
    assert m["rollout_rs_seq_masked_fraction"] == pytest.approx(1 / 2)
    assert m["rollout_rs_token_k2_masked_fraction"] == pytest.approx(1 / 4)
    assert m["rollout_rs_seq_sum_k1_seq_masked_fraction"] == pytest.approx(1 / 2)


def test_rs_options_are_verls_eleven():
    assert len(ROLLOUT_RS.names()) == 11 and "seq_max_k1" not in ROLLOUT_RS


@pytest.mark.parametrize(
    ("rs", "threshold", "match"),
    [
        ("seq_men_k3", 1.0, "Did you mean 'seq_mean_k3'"),
        ("token_k2", None, "needs algorithm.rollout_correction.rollout_rs_threshold"),
        ("token_k2,seq_mean_k3", "0.1,0.2,0.3", "3 entries for 2"),
        ("token_k1", "2.0_0.5", "0 < lower < upper"),
        ("token_k2", "0.1_0.2", "one upper bound"),
        ("seq_max_k3", "abc", "not a number"),
    ],
)
def test_bad_rollout_rs_names_the_key(rs, threshold, match):
    with pytest.raises(ValueError, match=match):
        parse_rollout_rs(rs, threshold)


def test_effective_sample_size():
    assert effective_sample_size(torch.ones(5)) == pytest.approx(1.0)
    assert effective_sample_size(torch.tensor([1.0, 0.0])) == pytest.approx(0.5)  # (1)^2 / (2 * 1)
    assert effective_sample_size(torch.tensor([1.0, 3.0])) == pytest.approx(16 / 20)


def test_is_metrics_token_level_hand_computed():
    w = rollout_is_weights(OLD, ROLLOUT, MASK, "token", threshold=2.0)
    m = is_metrics(OLD, ROLLOUT, MASK, w, "token", 2.0, band=(0.7, 5.0))
    applied = [E(0.5), E(-0.5), 2.0, E(0.1)]
    mean = sum(applied) / 4
    assert m["rollout_is_mean"] == pytest.approx(mean)
    assert m["rollout_is_std"] == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in applied) / 4))
    assert m["rollout_is_min"] == pytest.approx(E(-0.5)) and m["rollout_is_max"] == pytest.approx(E(2.0))
    assert m["rollout_is_eff_sample_size"] == pytest.approx(
        sum(applied) ** 2 / (4 * sum(x * x for x in applied))
    )
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(1 / 4)  # e^2 > 2
    assert m["rollout_is_ratio_fraction_low"] == 0.0  # none below 1/2
    assert m["rollout_is_band_fraction"] == pytest.approx(2 / 4)  # e^-0.5 < 0.7, e^2 > 5
    seq = [(E(0.5) + E(-0.5) + 2.0) / 3, E(0.1)]  # per sequence, the mean applied (truncated) weight
    assert m["rollout_is_seq_mean"] == pytest.approx(sum(seq) / 2)
    assert m["rollout_is_seq_std"] == pytest.approx(abs(seq[0] - seq[1]) / math.sqrt(2))  # unbiased
    assert m["rollout_is_seq_max"] == pytest.approx(seq[0]) and m["rollout_is_seq_min"] == pytest.approx(
        seq[1]
    )
    assert m["rollout_is_seq_max_deviation"] == pytest.approx(seq[0] - 1)
    # the high fraction counts the mean *raw* ratio: (e^0.5 + e^-0.5 + e^2) / 3 = 3.2 > 2
    assert m["rollout_is_seq_fraction_high"] == pytest.approx(1 / 2)
    assert all(math.isfinite(v) for v in m.values())


def test_is_metrics_sequence_level_counts_sequences():
    w = rollout_is_weights(OLD, ROLLOUT, MASK, "sequence", threshold=2.0)  # 2 (from e^2), e^0.1
    m = is_metrics(OLD, ROLLOUT, MASK, w, "sequence", 2.0)
    assert m["rollout_is_mean"] == pytest.approx((2.0 + E(0.1)) / 2)  # one per sequence, not per token
    assert m["rollout_is_max"] == pytest.approx(E(2.0)) and m["rollout_is_min"] == pytest.approx(E(0.1))
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(1 / 2)


def test_offpolicy_metrics_hand_computed():
    old = torch.tensor([[-1.0, -2.0], [-1.0, float("-inf")]])
    rollout = torch.tensor([[-1.5, -2.0], [-0.5, float("nan")]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    m = offpolicy_metrics(old, rollout, mask)
    # log ppl per sequence: training (1.5, 1.0), rollout (1.75, 0.5); difference (-0.25, 0.5)
    assert m["training_log_ppl"] == pytest.approx(1.25) and m["rollout_log_ppl"] == pytest.approx(1.125)
    assert m["training_ppl"] == pytest.approx((E(1.5) + E(1.0)) / 2)
    assert m["rollout_ppl"] == pytest.approx((E(1.75) + E(0.5)) / 2)
    assert m["log_ppl_diff"] == pytest.approx(0.125) and m["log_ppl_abs_diff"] == pytest.approx(0.375)
    assert m["log_ppl_diff_max"] == pytest.approx(0.5) and m["log_ppl_diff_min"] == pytest.approx(-0.25)
    assert m["ppl_ratio"] == pytest.approx((E(-0.25) + E(0.5)) / 2)
    # log r per token 0.5, 0, -0.5: chi2_token = mean r^2 - 1; per sequence 0.5, -0.5
    assert m["chi2_token"] == pytest.approx((E(1.0) + 1 + E(-1.0)) / 3 - 1)
    assert m["chi2_seq"] == pytest.approx((E(1.0) + E(-1.0)) / 2 - 1)


def test_no_valid_token_gives_no_nan():
    zero = torch.zeros(2, 3)
    weights, loss_mask, m = rollout_correction(
        OLD, ROLLOUT, zero, rollout_is="sequence", rollout_is_batch_normalize=True, rollout_rs="token_k3",
        rollout_rs_threshold=0.1,
    )  # fmt: skip
    assert torch.equal(weights, zero) and torch.equal(loss_mask, zero)
    assert all(math.isfinite(v) for v in m.values())


def test_rollout_correction_normalises_over_the_kept_tokens():
    weights, loss_mask, m = rollout_correction(
        OLD,
        ROLLOUT,
        MASK,
        rollout_is="token",
        rollout_is_threshold=2.0,
        rollout_is_batch_normalize=True,
        rollout_rs="token_k2",
        rollout_rs_threshold=0.2,
    )
    assert loss_mask.tolist() == [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]  # e^2's token rejected
    kept_mean = (E(0.5) + E(-0.5) + E(0.1)) / 3
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(kept_mean)
    assert float(weights[loss_mask.bool()].mean()) == pytest.approx(1.0)
    assert m["rollout_is_mean"] == pytest.approx((E(0.5) + E(-0.5) + 2.0 + E(0.1)) / 4)  # before normalising
    assert m["rollout_rs_masked_fraction"] == pytest.approx(1 / 4) and "chi2_seq" in m


# ---- verl's per-option statistics of the rejection statistic (rollout_rs_<option>_*) ----------------
# Row 0 has log r = (0.5, -0.5, 2.0), row 1 has 0.1 (OLD, ROLLOUT above).


def _pop_std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def _rs_stats(option: str, threshold) -> dict[str, float]:
    old, rollout = OLD.double(), ROLLOUT.double()  # float64: k3 of a small log r loses digits in float32
    _, _, m = rollout_correction(old, rollout, MASK, rollout_rs=option, rollout_rs_threshold=threshold)
    prefix = f"rollout_rs_{option}_"
    return {k.removeprefix(prefix): v for k, v in m.items() if k.startswith(prefix)}


def test_rs_statistics_of_token_k1_over_tokens_in_log_space():
    m = _rs_stats("token_k1", "0.5_2.0")  # s = -log r: -0.5, 0.5, -2.0 | -0.1; bounds +-log 2 = +-0.693
    assert m["mean"] == pytest.approx(-2.1 / 4)
    assert (m["max"], m["min"]) == (pytest.approx(0.5), pytest.approx(-2.0))
    assert (m["fraction_high"], m["fraction_low"]) == (0.0, pytest.approx(1 / 4))  # -2.0 < -0.693
    assert m["std"] == pytest.approx(_pop_std([-0.5, 0.5, -math.log(2), -0.1]))  # clamped to the bounds
    seq = [-2 / 3, -0.1]  # per sequence, the mean of its tokens' s
    assert m["seq_mean"] == pytest.approx(sum(seq) / 2)
    assert m["seq_std"] == pytest.approx((seq[1] - seq[0]) / math.sqrt(2))  # unbiased
    assert (m["seq_max"], m["seq_min"]) == (pytest.approx(-0.1), pytest.approx(-2 / 3))
    assert m["seq_max_deviation"] == pytest.approx(2 / 3)
    assert (m["seq_fraction_high"], m["seq_fraction_low"]) == (0.0, 0.0)  # -2/3 > -0.693
    assert m["masked_fraction"] == pytest.approx(1 / 4) and m["seq_masked_fraction"] == pytest.approx(1 / 2)
    assert len(m) == 13 + 2  # verl's 13 for a k1 option, and the two rejected shares


def test_rs_statistics_of_token_k3_count_tokens_above_the_bound():
    k3 = [E(0.5) - 1.5, E(-0.5) + 0.5 - 1, E(2.0) - 3, E(0.1) - 1.1]  # r - 1 - log r
    m = _rs_stats("token_k3", 0.12)
    assert m["mean"] == pytest.approx(sum(k3) / 4)
    assert (m["max"], m["min"]) == (pytest.approx(k3[2]), pytest.approx(k3[3]))
    assert (m["fraction_high"], m["fraction_low"]) == (pytest.approx(2 / 4), 0.0)  # 0.149, 4.39 > 0.12
    assert m["std"] == pytest.approx(_pop_std([0.12, k3[1], 0.12, k3[3]]))  # clamped to [0, 0.12]
    seq = [sum(k3[:3]) / 3, k3[3]]
    assert m["seq_mean"] == pytest.approx(sum(seq) / 2) and m["seq_max_deviation"] == pytest.approx(seq[0])
    assert m["seq_fraction_high"] == pytest.approx(1 / 2)
    assert "seq_fraction_low" not in m and len(m) == 12 + 2  # no lower bound: verl logs 12


def test_rs_statistics_of_a_sequence_option_count_sequences_and_weigh_tokens():
    m = _rs_stats("seq_sum_k2", 2.0)  # s = sum (log r)^2 / 2: 2.25 (3 tokens) and 0.005 (1 token)
    assert m["mean"] == pytest.approx((3 * 2.25 + 0.005) / 4)  # each token carries its sequence's s
    assert (m["max"], m["min"]) == (pytest.approx(2.25), pytest.approx(0.005))  # over sequences
    assert (m["fraction_high"], m["fraction_low"]) == (pytest.approx(1 / 2), 0.0)  # of sequences
    assert m["std"] == pytest.approx(_pop_std([2.0, 2.0, 2.0, 0.005]))  # tokens, clamped at 2.0
    assert m["seq_mean"] == pytest.approx((2.25 + 0.005) / 2)
    assert m["seq_std"] == pytest.approx((2.25 - 0.005) / math.sqrt(2))
    assert (m["seq_max"], m["seq_min"], m["seq_max_deviation"]) == pytest.approx((2.25, 0.005, 2.25))
    assert m["seq_fraction_high"] == pytest.approx(1 / 2)
    assert m["masked_fraction"] == pytest.approx(3 / 4)


@pytest.mark.parametrize(
    ("option", "threshold", "seq", "fraction_high"),
    [
        ("seq_mean_k1", "0.5_2.0", [-2 / 3, -0.1], 0.0),  # mean of -log r
        ("seq_mean_k2", 0.7, [0.75, 0.005], 0.5),
        ("seq_sum_k3", 4.6, [E(0.5) + E(-0.5) + E(2.0) - 5, E(0.1) - 1.1], 0.5),  # 4.645
        ("seq_max_k3", 4.4, [E(2.0) - 3, E(0.1) - 1.1], 0.0),
    ],
)
def test_rs_statistics_of_each_sequence_option(option, threshold, seq, fraction_high):
    m = _rs_stats(option, threshold)
    assert m["seq_mean"] == pytest.approx(sum(seq) / 2) and m["mean"] == pytest.approx(
        (3 * seq[0] + seq[1]) / 4
    )
    assert (m["max"], m["min"]) == (pytest.approx(max(seq)), pytest.approx(min(seq)))
    assert m["fraction_high"] == m["seq_fraction_high"] == pytest.approx(fraction_high)
    assert ("seq_fraction_low" in m) == option.endswith("k1")


def test_rs_statistics_are_logged_for_every_option_and_not_without_metrics():
    _, _, m = rollout_correction(
        OLD, ROLLOUT, MASK, rollout_rs="token_k2,seq_sum_k1", rollout_rs_threshold="0.2,0.5_2.0"
    )
    assert m["rollout_rs_token_k2_max"] == pytest.approx(2.0) and m[
        "rollout_rs_seq_sum_k1_min"
    ] == pytest.approx(-2.0)
    _, _, m = rollout_correction(
        OLD, ROLLOUT, MASK, rollout_rs="token_k2", rollout_rs_threshold=0.2, with_metrics=False
    )
    assert m == {}
