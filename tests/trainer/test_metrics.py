import pytest
import torch

from tandem.batch import Batch
from tandem.trainer.metrics import batch_metrics, throughput_metrics, worker_metrics


def sample_batch():
    # two samples: prompt 2 and 3 tokens (left-padded to 3), responses of 3 and 1 tokens (max 3)
    attention = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 0.0]])
    return Batch.from_dict(
        {
            "attention_mask": attention,
            "response_mask": mask,
            "token_level_scores": scores,
            "token_level_rewards": scores - 0.1 * mask,
            "advantages": torch.tensor([[1.0, 2.0, 3.0], [-4.0, 9.0, 9.0]]),
            "returns": torch.tensor([[1.0, 1.0, 1.0], [0.0, 7.0, 7.0]]),
            "values": torch.tensor([[0.5, 0.5, 0.5], [0.5, 7.0, 7.0]]),
            "entropy": torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]]),
        }
    )


def test_batch_metrics_by_hand():
    m = batch_metrics(sample_batch(), max_response_length=3)
    assert m["response_length/mean"] == 2 and m["response_length/max"] == 3 and m["response_length/min"] == 1
    assert m["response_length/clip_ratio"] == 0.5  # one of two hit 3 tokens
    assert m["prompt_length/mean"] == 2.5
    assert m["score/mean"] == pytest.approx(0.75) and m["score/max"] == 1.0
    assert m["rewards/mean"] == pytest.approx(((1 - 0.3) + (0.5 - 0.1)) / 2)
    # padding (the 9s and 100s) never counts
    assert m["advantages/mean"] == pytest.approx((1 + 2 + 3 - 4) / 4) and m["advantages/max"] == 3
    assert m["actor/entropy"] == pytest.approx((1 + 2 + 3 + 4) / 4)
    # returns [1, 1, 1, 0], values [.5, .5, .5, .5]: Var(R) = 3/16, Var(R - V) = 3/16 -> 0
    assert m["critic/vf_explained_var"] == pytest.approx(0.0)


def test_throughput_and_shares():
    m = throughput_metrics(sample_batch(), {"step": 2.0, "generate": 0.5, "update_actor": 1.0})
    assert m["perf/total_tokens"] == 9 and m["perf/response_tokens"] == 4
    assert m["perf/tokens_per_s"] == 4.5 and m["perf/generated_tokens_per_s"] == 8
    assert m["timing_share/generate"] == 0.25 and m["timing_share/update_actor"] == 0.5
    assert m["timing_s/step"] == 2.0 and "timing_share/step" not in m


def test_worker_metrics_take_the_max_over_ranks_and_sum_the_memory_of_every_worker():
    merged = worker_metrics(
        [{"memory/peak_rss_gib": 1.0, "a": 3.0}, {"memory/peak_rss_gib": 2.0}, {"memory/peak_rss_gib": 0.5}]
    )
    assert merged == {
        "memory/peak_rss_gib": 2.0,
        "memory/peak_rss_gib_sum": 3.5,
        "memory/workers": 3.0,
        "a": 3.0,
    }
