import torch

from tandem.trainer.sync_source import _merge_reward_metrics, varied_groups


def test_varied_groups_keeps_the_groups_with_two_different_values():
    values = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    uid = ["a", "a", "b", "b", "c", "c", "d", "d"]
    assert varied_groups(values, uid).tolist() == [2, 3]


def test_varied_groups_of_interleaved_uids():
    values = torch.tensor([0.0, 5.0, 1.0, 5.0])
    assert varied_groups(values, ["x", "y", "x", "y"]).tolist() == [0, 2]


def test_reward_metrics_of_rounds_sum_counts_and_weight_means_by_samples():
    merged = _merge_reward_metrics(
        [
            (8, {"reward/error_count": 1.0, "reward/score_mean": 0.5}),
            (24, {"reward/error_count": 2.0, "reward/score_mean": 1.0}),
        ]
    )
    assert merged == {"reward/error_count": 3.0, "reward/score_mean": (8 * 0.5 + 24 * 1.0) / 32}
