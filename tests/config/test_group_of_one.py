"""rollout.n=1 with a group estimator runs as verl runs it (no baseline: the advantage is the raw score),
with a start-up warning that says so; grpo_passk, which verl stops on, is refused."""

import logging

import pytest
from config_helpers import error_of

from tandem.config import load_config

LOGGER = "tandem.config.checks.algorithm"


def warnings_of(caplog, *overrides):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        cfg = load_config("grpo", list(overrides))
    return cfg, [r.getMessage() for r in caplog.records if r.name == LOGGER]


@pytest.mark.parametrize(
    "estimator", ["grpo", "dr_grpo", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline"]
)
def test_one_sample_per_prompt_is_accepted_with_a_warning(caplog, estimator):
    cfg, (message,) = warnings_of(caplog, f"algorithm.adv_estimator={estimator}", "rollout.n=1")
    assert cfg.rollout.n == 1
    assert message == (
        f"algorithm.adv_estimator={estimator} compares the samples of a prompt, but rollout.n=1 gives one "
        "sample per prompt: there is no baseline, so each sample's advantage is its raw score (as in verl: "
        "group mean 0, std 1). Every sample with a positive score is reinforced. Set rollout.n>=2 (4-16 is "
        "usual) for a group baseline"
    )


def test_no_warning_with_groups_or_without_a_group_estimator(caplog):
    assert warnings_of(caplog, "rollout.n=2")[1] == []
    assert warnings_of(caplog, "algorithm.adv_estimator=reinforce_plus_plus", "rollout.n=1")[1] == []


def test_pass_at_k_needs_two_samples_per_prompt(real_registries):
    message = error_of("algorithm.adv_estimator=grpo_passk", "rollout.n=1")
    assert "every advantage would be 0 (verl stops there too). Set rollout.n>=2" in message
