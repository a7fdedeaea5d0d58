import pytest
import torch

from tandem.batch import Batch
from tandem.config import load_config
from tandem.config.errors import ConfigError
from tandem.trainer.dumps import REWARD_EXTRA_KEY
from tandem.trainer.sync_source import _merge_reward_metrics, sample_metric, varied_groups


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


def scored_batch(with_rewards: bool = False) -> Batch:
    """Four groups of two samples, scored as Rollouts.score leaves them: the scorer's acc, the token-level scores
    (each sample's score at its last token; the second sample of 'b' ran long: its overlong term -0.5 is in its
    score) and the reward terms of each sample; with_rewards: token-level rewards after a KL penalty too."""
    scores = torch.zeros(8, 3)
    scores[:, -1] = torch.tensor([1.0, 1.0, 1.0, 0.5, 0.0, 0.0, 1.0, 0.0])
    tensors = {"acc": torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]), "token_level_scores": scores}
    if with_rewards:
        kl = torch.tensor([0.0, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
        tensors["token_level_rewards"] = scores - torch.nn.functional.pad(kl[:, None], (2, 0))
    terms = [
        {"acc": a, "format": f, "overlong": o}
        for a, f, o in zip([1, 1, 1, 1, 0, 0, 1, 0], [1, 1, 1, 1, 1, 0, 1, 1], [0, 0, 0, -0.5, 0, 0, 0, 0])
    ]
    return Batch.from_dict(
        tensors, {"uid": ["a", "a", "b", "b", "c", "c", "d", "d"], REWARD_EXTRA_KEY: terms}
    )


def kept(batch: Batch, metric: str) -> list[int]:
    return varied_groups(sample_metric(batch, metric), batch["uid"]).tolist()


def test_groups_are_kept_by_each_value_verl_names():
    """verl's DAPO trainer: seq_reward sums token_level_scores, seq_final_reward token_level_rewards (the scores
    when no KL penalty made rewards of them), any other name is a per-sample value of the reward's extra info."""
    batch = scored_batch()
    assert kept(batch, "acc") == [6, 7]  # b's two samples are both right
    assert kept(batch, "seq_final_reward") == [2, 3, 6, 7]  # ... but one ran long: 1.0 vs 0.5
    assert sample_metric(batch, "seq_final_reward").tolist() == [1.0, 1.0, 1.0, 0.5, 0.0, 0.0, 1.0, 0.0]
    assert kept(batch, "seq_reward") == kept(batch, "score") == [2, 3, 6, 7]
    assert kept(batch, "format") == [4, 5]
    assert kept(batch, "overlong") == [2, 3]
    # after a KL penalty a's rewards differ (1.0 vs 0.9) while its scores do not
    penalised = scored_batch(with_rewards=True)
    assert sample_metric(penalised, "seq_final_reward").tolist() == pytest.approx(
        [1.0, 0.9, 1.0, 0.5, 0.0, 0.0, 1.0, 0.0]
    )
    assert kept(penalised, "seq_final_reward") == [0, 1, 2, 3, 6, 7]
    assert kept(penalised, "seq_reward") == [2, 3, 6, 7]


def test_a_name_no_sample_carries_is_an_error_naming_those_that_exist():
    with pytest.raises(ValueError) as error:
        sample_metric(scored_batch(), "correctness")
    assert "metric='correctness'" in str(error.value) and "8 of 8 samples lack it" in str(error.value)
    assert "acc, score, seq_reward, seq_final_reward, format, overlong" in str(error.value)


def test_verls_filter_groups_metric_maps_and_seq_final_reward_with_kl_in_reward_is_refused():
    line = ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=seq_final_reward"]
    cfg = load_config("dapo", line, on_verl=lambda t: None)
    assert (
        cfg.algorithm.dynamic_sampling.enable and cfg.algorithm.dynamic_sampling.metric == "seq_final_reward"
    )
    term = load_config("dapo", [*line[:1], "algorithm.filter_groups.metric=format"], on_verl=lambda t: None)
    assert term.algorithm.dynamic_sampling.metric == "format"  # a reward term: checked on the first round
    with pytest.raises(ConfigError, match="metric=seq_final_reward keeps groups by the rewards after the KL"):
        load_config("dapo", [*line, "algorithm.use_kl_in_reward=true"], on_verl=lambda t: None)
