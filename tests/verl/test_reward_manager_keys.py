"""verl's reward-manager keys: reward_model.reward_manager / reward_manager.name / reward.reward_manager.name
(naive, dapo, gdpo, prime: Tandem's per-sample manager; batch: verl's batch manager), reward_manager.source /
module.path (a class of the user's), reward_model.reward_kwargs; and a step of a run scored by each."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tandem.config import ConfigError, load_config
from tandem.config.verl.keys import VERL_KEYS
from tandem.config.verl.translate import translate_overrides
from tandem.rewards import ManagerClassRewards, RewardManager, reward_manager_from_config

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the rewards' and the trainer's test helpers
from rewards.test_manager import CharTokenizer, make_batch
from rewards.test_manager_class import CharTokenizer as DecodingTokenizer
from rewards.test_manager_class import rollout_batch

REWARD_FILE = textwrap.dedent(
    '''
    from collections import defaultdict

    import torch


    def batch_score(data_sources, solution_strs, ground_truths, extra_infos, weight=1.0):
        """verl's batch-manager signature: the right answer scores `weight`, plus 0.01 per character."""
        return [weight * float(s.strip() == str(g)) + 0.01 * len(s) for s, g in zip(solution_strs, ground_truths)]


    class MarkerManager:
        """A reward manager as verl's interface has it; every sample's reward is the marker 0.123."""

        def __init__(self, tokenizer, num_examine, compute_score=None, reward_fn_key="data_source", marker=0.0):
            self.marker = marker

        def __call__(self, data, return_dict=False):
            prompt_length = data.batch["prompts"].shape[-1]
            lengths = data.batch["attention_mask"][:, prompt_length:].sum(-1)
            reward = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
            reward[torch.arange(len(data)), lengths - 1] = self.marker
            info = {"marker": [self.marker] * len(data)}
            return {"reward_tensor": reward, "reward_extra_info": info} if return_dict else reward
    '''
)
BATCH_KEYS = ("reward_model.reward_manager", "reward_manager.name", "reward.reward_manager.name")


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(REWARD_FILE)
    return path


@pytest.mark.parametrize("key", BATCH_KEYS)
def test_batch_calls_the_function_with_lists_as_verls_batch_manager(reward_file, key):
    line = [
        f"{key}=batch",
        f"custom_reward_function.path={reward_file}",
        "custom_reward_function.name=batch_score",
        "+reward_model.reward_kwargs.weight=2.0",
        "reward_model.num_workers=0",
    ]
    cfg = load_config("verl", line)
    assert (cfg.reward.manager, cfg.reward.manager_kwargs) == ("batch", {"weight": 2.0})
    with reward_manager_from_config(cfg, CharTokenizer()) as manager:
        result = manager(make_batch(["12", "7", "abc"], ["addition"] * 3, ["12", "8", "abc"], width=5))
    # 2.0 x right + 0.01 x characters, by hand
    assert result.scores.tolist() == pytest.approx([2.02, 0.01, 2.03])
    assert result.token_level_scores[:, 2].tolist() == pytest.approx([2.02, 0.0, 0.0])  # "12": the EOS at 2
    assert result.token_level_scores[1, 1] == pytest.approx(0.01) and result.token_level_scores[2, 3] == 2.03
    assert result.metrics["reward/error_count"] == 0.0


@pytest.mark.parametrize(("name", "tandem"), [("naive", "naive"), ("dapo", "naive"), ("prime", "naive")])
def test_the_per_sample_managers_are_tandems_naive(name, tandem):
    t = translate_overrides([f"reward_model.reward_manager={name}"])
    assert t.overrides == [f"reward.manager={tandem}"] and t.problems == []
    assert (
        type(reward_manager_from_config(load_config("verl", t.overrides), CharTokenizer())) is RewardManager
    )


def test_primes_note_says_what_matches_and_what_differs():
    note = VERL_KEYS["reward_model.reward_manager"].note
    for fact in (
        "prime: as in verl each sample is scored in a process of a pool",
        "verl: 300 s from when the batch is handed to the pool",
        "reward.timeout_s=300",
        "verl: 64, new for each batch",
        "verl's prime scores the whole batch 0 when the function returns a dict",
        "verl takes its first item",
        "verl 0.7 runs batch and prime only with reward_model.use_reward_loop=false",
    ):
        assert fact in note


def test_a_class_of_the_users_is_loaded_as_verl_loads_it(reward_file):
    line = [
        "reward_manager.source=importlib",
        f"reward_manager.module.path={reward_file}",
        "reward_manager.name=MarkerManager",
        "+reward_model.reward_kwargs.marker=0.123",
    ]
    cfg = load_config("verl", line)
    manager = reward_manager_from_config(cfg, DecodingTokenizer())
    assert isinstance(manager, ManagerClassRewards)
    result = manager(rollout_batch(["1+2="], ["3"], ["addition"], ["3"]))
    assert result.token_level_scores[0].tolist() == pytest.approx([0.0, 0.123, 0, 0, 0, 0])
    np.testing.assert_allclose(result.extra["marker"], [0.123])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            ["reward_model.reward_manager=limited"],
            "reward.manager='limited' is not a reward manager Tandem has",
        ),
        (["reward_model.reward_manager=batch"], "reward.manager=batch calls your function once per batch"),
        (
            ["+reward_model.reward_kwargs.weight=2"],
            r"reward.manager_kwargs \['weight'\] .* go to a batch function",
        ),
        (
            ["reward_manager.source=importlib", "reward_manager.name=X"],
            "set reward.manager_file=path/to/file.py",
        ),
        (["reward_manager.module.path=x.py"], "read with reward.manager_source=importlib only"),
        (["reward_manager.source=importlib", "reward_manager.module.path=no/such.py"], "does not exist"),
    ],
)
def test_what_cannot_be_honoured_is_refused_naming_the_key(line, message):
    with pytest.raises(ConfigError, match=message):
        load_config("verl", line)


def test_module_name_has_no_effect_and_an_unknown_key_is_refused():
    t = translate_overrides(["reward_manager.module.name=my_module", "reward_manager.bogus=1"])
    assert [text for text, _ in t.no_effect] == ["reward_manager.module.name=my_module"]
    assert [key for key, _ in t.problems] == ["reward_manager.bogus"]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("manager", ["batch", "class"])
def test_a_step_is_scored_by_the_batch_function_or_the_class(reward_file, tmp_path, manager):
    from tandem.trainer import RLTrainer
    from trainer.trainer_helpers import make_assets, run_config

    assets = make_assets(tmp_path / "assets")
    keys = {
        "batch": [
            "reward_model.reward_manager=batch",
            f"custom_reward_function.path={reward_file}",
            "custom_reward_function.name=batch_score",
        ],
        "class": [
            "reward_manager.source=importlib",
            f"reward_manager.module.path={reward_file}",
            "reward_manager.name=MarkerManager",
            "+reward_model.reward_kwargs.marker=0.123",
        ],
    }[manager]
    cfg = run_config(
        assets,
        tmp_path,
        "grpo",
        "trainer.backend=inprocess",
        "trainer.workers_per_node=1",
        "trainer.total_training_steps=1",
        "reward.num_workers=1",
        *keys,
    )
    (metrics,) = RLTrainer(cfg).fit()
    assert metrics["reward/error_count"] == 0 and metrics["reward/timeout_count"] == 0
    if manager == "class":
        assert metrics["reward/score_mean"] == pytest.approx(0.123)
        assert metrics["score/max"] == pytest.approx(0.123)
    else:  # 1 for the right sum + 0.01 a character: at most 1.06 for 6 tokens
        assert 0 <= metrics["score/min"] <= metrics["score/max"] <= 1.06 and metrics["score/max"] > 0
