"""algorithm.adv_estimator=rloo_vectorized, in Tandem's keys and verl's, runs verl's vectorized RLOO; with
rollout.n=1 (every advantage 0) it is refused, not warned."""

import logging

import pytest
import torch
from config_helpers import error_of

from tandem.algos import compute_advantages
from tandem.config import ConfigError, load_config


@pytest.mark.parametrize(
    ("preset", "overrides"),
    [
        ("grpo", ["algorithm.adv_estimator=rloo_vectorized", "rollout.n=3"]),
        ("verl", ["algorithm.adv_estimator=rloo_vectorized", "actor_rollout_ref.rollout.n=3"]),
    ],
)
def test_rloo_vectorized_loads_and_computes_verls_numbers(preset, overrides):
    cfg = load_config(preset, overrides)
    assert cfg.algorithm.adv_estimator == "rloo_vectorized" and cfg.rollout.n == 3
    # a = (2, 0, 1): (3 s - 3) / 2 -> (1.5, -1.5, 0); b alone (a partial last batch): 0, as verl
    scores = torch.tensor([[2.0], [0.0], [1.0], [5.0]])
    adv, _ = compute_advantages(
        cfg.algorithm.adv_estimator, scores, torch.ones(4, 1), index=["a", "a", "a", "b"]
    )
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.5, -1.5, 0.0, 0.0]))


@pytest.mark.parametrize(
    ("preset", "n_key"), [("grpo", "rollout.n"), ("verl", "actor_rollout_ref.rollout.n")]
)
def test_one_sample_per_prompt_is_refused(real_registries, caplog, preset, n_key):
    with caplog.at_level(logging.WARNING, logger="tandem.config.checks.algorithm"):
        message = error_of("algorithm.adv_estimator=rloo_vectorized", f"{n_key}=1", preset=preset)
    assert (
        "algorithm.adv_estimator=rloo_vectorized gives a sample that is alone in its group advantage 0 (as in "
        "verl), and rollout.n=1 gives one sample per prompt: every advantage would be 0 and the rewards would "
        "teach nothing. Set rollout.n>=2 (4-16 is usual), or pick an estimator that gives a lone sample its "
        "raw score, such as rloo"
    ) in message
    assert "raw score (as in verl: group mean 0, std 1)" not in caplog.text  # refused, not also warned


def test_rloo_with_one_sample_per_prompt_is_still_only_warned():
    cfg = load_config("grpo", ["algorithm.adv_estimator=rloo", "rollout.n=1"])
    assert cfg.rollout.n == 1
    with pytest.raises(ConfigError):
        load_config("grpo", ["algorithm.adv_estimator=rloo_vectorized", "rollout.n=1"])
